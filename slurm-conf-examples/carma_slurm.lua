--[[
CARMA transparent collocation, for slurmctld's job_submit/lua and the
submit hosts' cli_filter/lua (one module for both; see job_submit.lua and
cli_filter.lua beside this file for how each loads it).

job_submit (slurmctld; users cannot go around it): in the scopes that
carma.yaml's `transparent:` names (partitions, accounts, QOS), a batch job
that asks for whole GPUs (`--gres=gpu:N`, `--gpus-per-node=N`, or `--gpus=N`
on one node) is rewritten to ask for N shards instead, so that Slurm admits
several such jobs per GPU; CARMA's plugin then places it on a GPU with room
(memory and SM activity) on every node it runs on. The rewrite is recorded
in the job's comment (`scontrol show job`, `squeue -o %k`).

cli_filter (srun): a step inside such a job that asks for GPUs
(`srun --gres=gpu:1`, `srun --gpus=1`) asks for as many shards instead, the
form of GPU the job holds; without it Slurm refuses such steps
("Step requested GRES (gpu) not found in the job").

Admission by GPU memory (job_submit): in the scopes carma.yaml's
`admission:` names, a CARMA job (any --carma-* option, or rewritten above)
also asks for the count-only GRES `carmamem` (gres.conf Count= GiB per node,
no File=): its size per GPU plus the headroom, in GiB, times its GPUs.
slurmctld then sends it only to a node with that much left; the plugin
still chooses the GPU and grants its device (docs/admission.md).

One owner per GPU (job_submit): a CARMA job that holds no gpu or shard GRES
(after the rewrite above) is refused with one line naming --gres=shard:1 or
--gres=gpu:N: every GPU-second stays in Slurm's accounting.

Left unchanged: jobs outside the scopes; jobs started by srun or salloc
(their own steps ask Slurm for gpu, which the job would no longer hold);
`--carma-policy=exclusive` (the user's opt-out); typed GPUs (`gpu:a100:1`);
GPUs per task or socket; `--cpus-per-gpu`, `--mem-per-gpu`,
`--ntasks-per-gpu`; `--gpus=N` over several nodes; a pending job moved into
a scope by `scontrol update` (Slurm refuses to turn its gpu into shard).
A pending job given GPUs by `scontrol update` in a scope is rewritten.

The scopes come from the file `carma transparent-scopes --output
/etc/slurm/carma-scopes` writes from carma.yaml (run it on the controller
after every change to carma.yaml's `transparent:` or `admission:`), read
at most every `refresh` seconds. slurmctld runs job_submit under its locks,
so this script starts no process and runs no shell: it only reads that
file. When the file cannot be read or is incomplete, the last good list
stays in force (at first: none, so nothing is rewritten), with a line in
slurmctld's log.
--]]

local carma = {
	scopes_file = "/etc/slurm/carma-scopes",
	refresh = 60,
	-- The Slurm series the package was built for (written by build-deb.sh).
	series_file = "/usr/share/carma-slurm/slurm-series",
}

local scopes = nil -- last good list
local admits = {} -- admission scopes of the last good answer
local loaded_at = nil
local NO_VAL = slurm.NO_VAL or 4294967294

local function log_info(fmt, ...)
	slurm.log_info("carma: " .. fmt, ...)
end

local function log_error(fmt, ...)
	slurm.log_error("carma: " .. fmt, ...)
end

-- Parses `carma transparent-scopes`: a header, `scope k=v ...` lines
-- (transparent collocation), `admit k=v ...` lines (admission by GPU
-- memory), `end`.
local function parse(text)
	local list, admit, header, complete = {}, {}, false, false
	for line in string.gmatch(text, "[^\n]+") do
		if line == "carma-transparent-scopes 1" then
			header = true
		elseif line == "end" then
			complete = header
		elseif header and (string.sub(line, 1, 6) == "scope " or string.sub(line, 1, 6) == "admit ") then
			local s = {}
			for k, v in string.gmatch(line, "([%w_]+)=(%S+)") do
				if v ~= "*" then
					s[k] = v
				end
			end
			table.insert(string.sub(line, 1, 6) == "scope " and list or admit, s)
		end
	end
	if complete then
		return list, admit
	end
	return nil
end

local function current_scopes()
	local now = os.time()
	if loaded_at ~= nil and now - loaded_at < carma.refresh then
		return scopes or {}
	end
	loaded_at = now
	local f, err = io.open(carma.scopes_file, "r")
	-- The file is a few lines; read no more than 64 KiB of anything else.
	local text = f and f:read(65536) or ""
	if f then
		f:close()
	end
	local list, admit = parse(text)
	if list == nil then
		local why = err or "incomplete (no 'end' line)"
		log_error("cannot read the transparent scopes from %s: %s; keeping %d scope(s) (fix: carma transparent-scopes --config /etc/slurm/carma.yaml --output %s)",
			carma.scopes_file, why, scopes and #scopes or 0, carma.scopes_file)
	else
		if scopes == nil or #list ~= #scopes then
			log_info("%d transparent scope(s) in force", #list)
		end
		if #admit ~= #admits then
			log_info("%d admission scope(s) in force", #admit)
		end
		scopes = list
		admits = admit
	end
	return scopes or {}
end

local function scope_matches(s, partition, account, qos)
	return (s.partition == nil or s.partition == partition)
		and (s.account == nil or s.account == account)
		and (s.qos == nil or s.qos == qos)
end

local function find_scope(list, partition, account, qos)
	for _, s in ipairs(list) do
		if scope_matches(s, partition, account, qos) then
			return s
		end
	end
	return nil
end

local function describe(s)
	local parts = {}
	for _, k in ipairs({ "partition", "account", "qos" }) do
		if s[k] then
			table.insert(parts, k .. ":" .. s[k])
		end
	end
	return table.concat(parts, ",")
end

-- The default partition when the job names none.
local function default_partition(part_list)
	for name, part in pairs(part_list or {}) do
		if part.flag_default == 1 then
			return name
		end
	end
	return nil
end

-- "gres:gpu:2,gres:foo:1" -> "gres:shard:2,gres:foo:1", 2; nil when the
-- spec asks for no untyped GPUs or for typed ones (left to Slurm).
-- Slurm 22.05 spells a GRES in a TRES string "gres:gpu:2", 23.11 and later
-- "gres/gpu:2", and each refuses the other's spelling ("Invalid Trackable
-- RESource (TRES) specification"): a shard is written the way its GPU
-- came, and a bare "gpu:2" with the prefix `bare` (default "gres:").
local function to_shards(spec, bare)
	if spec == nil or spec == "" then
		return nil
	end
	if string.find(spec, "shard", 1, true) then
		return nil -- already shares; Slurm refuses two shard requests
	end
	local out, gpus, typed = {}, 0, false
	for item in string.gmatch(spec, "[^,]+") do
		local prefix = string.match(item, "^gres[:/]") or bare or "gres:"
		local base = string.gsub(item, "^gres[:/]", "")
		local n
		if base == "gpu" then
			n = 1
		else
			n = tonumber(string.match(base, "^gpu:(%d+)$"))
			if n == nil and string.match(base, "^gpu:") then
				typed = true
			end
		end
		if n ~= nil and n > 0 then
			gpus = gpus + n
			table.insert(out, prefix .. "shard:" .. n)
		else
			table.insert(out, item)
		end
	end
	if typed or gpus == 0 then
		return nil
	end
	return table.concat(out, ","), gpus
end

local function mentions_gpu(v)
	return v ~= nil and string.find(v, "gpu", 1, true) ~= nil
end

-- The user's explicit --carma-policy=exclusive (or CARMA_POLICY=exclusive),
-- as the carma plugin in sbatch/srun/salloc passed it on.
local function opted_out(job_desc)
	for _, kv in pairs(job_desc.spank_job_env or {}) do
		if kv == "CARMA_POLICY=exclusive" then
			return true
		end
	end
	return false
end

local function unset(v)
	return v == nil or v == NO_VAL or v == 0
end

-- The scope of `list` a job is in: its partition (a comma list: every
-- partition must be in a scope; the first one's applies), account, QOS.
local function job_scope(list, job, part_list)
	if #list == 0 then
		return nil
	end
	local partitions = job.partition or default_partition(part_list)
	if partitions == nil then
		return nil
	end
	local scope = nil
	for p in string.gmatch(partitions, "[^,]+") do
		local s = find_scope(list, p, job.account, job.qos)
		if s == nil then
			return nil
		end
		scope = scope or s
	end
	return scope
end

-- Rewrites job_desc's GPU request in place. `job` holds the facts that
-- decide the scope (partition may be a comma list: every partition must
-- be in scope); `batch`: a job with a script (jobs started by srun or
-- salloc keep whole GPUs). Returns the note recorded in the comment, or nil.
local function rewrite(job_desc, job, part_list, batch)
	local scope = job_scope(current_scopes(), job, part_list)
	if scope == nil then
		return nil
	end
	if opted_out(job_desc) or not batch then
		return nil
	end
	local per_node, per_job = job_desc.tres_per_node, job_desc.tres_per_job
	if not (mentions_gpu(per_node) or mentions_gpu(per_job)) then
		return nil
	end
	for _, field in ipairs({ "tres_per_task", "tres_per_socket", "cpus_per_tres", "mem_per_tres" }) do
		local v = job_desc[field]
		if type(v) == "string" and mentions_gpu(v) then
			log_info("job from uid %s keeps whole GPUs: %s=%s is not rewritten", tostring(job_desc.user_id), field, v)
			return nil
		end
	end
	local per_gpu = job_desc.ntasks_per_tres -- --ntasks-per-gpu; NO_VAL16 when unset
	if type(per_gpu) == "number" and not unset(per_gpu) and per_gpu ~= 65534 then
		return nil
	end
	-- Both specs are checked before either is changed.
	local node_spec, node_n, job_spec, job_n
	if mentions_gpu(per_node) then
		node_spec, node_n = to_shards(per_node)
		if node_spec == nil then
			return nil
		end
	end
	if mentions_gpu(per_job) then
		-- --gpus=N: only for one node, where it means N per node.
		job_spec, job_n = to_shards(per_job)
		local nodes = job_desc.min_nodes
		if job_spec == nil or (not unset(nodes) and nodes > 1) or node_spec ~= nil then
			return nil
		end
	end
	-- Slurm takes a job's shards from one GPU, and a step uses at most the
	-- GPUs Slurm allocated its job (whoever owns them: issue 58), so a job
	-- of more GPUs keeps them whole (the scopes file says max_gpus=1; a
	-- file an older `carma transparent-scopes` wrote lacks it, and its jobs
	-- of more GPUs would be refused when they start: 1 all the same).
	local max = tonumber(scope.max_gpus or "1") or 1
	if math.max(node_n or 0, job_n or 0) > max then
		log_info("job from uid %s keeps whole GPUs: more than %d per node, and one GPU holds a job's shards",
			tostring(job_desc.user_id), max)
		return nil
	end
	local before, after = {}, {}
	if node_spec ~= nil then
		table.insert(before, per_node)
		table.insert(after, node_spec)
		job_desc.tres_per_node = node_spec
	end
	if job_spec ~= nil then
		table.insert(before, per_job)
		table.insert(after, job_spec)
		job_desc.tres_per_job = ""
		job_desc.tres_per_node = job_spec
		if unset(job_desc.max_nodes) then
			job_desc.max_nodes = 1
		end
	end
	return string.format("carma: %s -> %s (transparent collocation, %s)", table.concat(before, ","),
		table.concat(after, ","), describe(scope)), scope
end

-- "gres/" on Slurm 23.11 and later, "gres:" before (the package's series).
local tres_prefix = nil
local function gres_prefix()
	if tres_prefix == nil then
		local f = io.open(carma.series_file, "r")
		local series = f and f:read("*l") or ""
		if f then
			f:close()
		end
		local major, minor = string.match(series, "^(%d+)%.(%d+)$")
		major, minor = tonumber(major), tonumber(minor)
		if major == nil then
			log_error("cannot read the Slurm series from %s: writing GRES as 23.11 and later do", carma.series_file)
			tres_prefix = "gres/"
		elseif major > 23 or (major == 23 and minor >= 11) then
			tres_prefix = "gres/"
		else
			tres_prefix = "gres:"
		end
	end
	return tres_prefix
end

-- The value of NAME in the job's SPANK environment (what the carma plugin
-- in sbatch/srun/salloc passed on: CARMA_MEM=36864M, CARMA_ESTIMATE=...).
local function spank_env(job_desc, name)
	for _, kv in pairs(job_desc.spank_job_env or {}) do
		local k, v = string.match(kv, "^([^=]+)=(.*)$")
		if k == name then
			return v
		end
	end
	return nil
end

-- Admission by GPU memory: a CARMA job in an `admission:` scope asks Slurm
-- for the count-only GRES (GiB per node), so that slurmctld sends it only
-- to a node with that much GPU memory unpromised. Its size per GPU is the
-- declared --carma-mem, else the estimate made at submit, else the
-- transparent scope's default (`default_mib`); plus the headroom; times its
-- GPUs. Exclusive jobs and jobs of unknown size are left to CARMA's wait.
local function admit(job_desc, job, part_list, default_mib)
	current_scopes()
	local scope = job_scope(admits, job, part_list)
	if scope == nil then
		return nil
	end
	if spank_env(job_desc, "CARMA_POLICY") == "exclusive" then
		return nil
	end
	local mib = tonumber(string.match(spank_env(job_desc, "CARMA_MEM") or "", "^(%d+)M$"))
		or tonumber(string.match(spank_env(job_desc, "CARMA_ESTIMATE") or "", "^(%d+)M"))
		or default_mib
	local headroom = tonumber(scope.headroom_mib)
	if mib == nil or headroom == nil or scope.gres == nil then
		return nil
	end
	local gpus = tonumber(spank_env(job_desc, "CARMA_GPUS") or "") or 1
	local gib = math.ceil((mib + headroom) / 1024) * gpus
	local spec = gres_prefix() .. scope.gres .. ":" .. gib
	local per_node = job_desc.tres_per_node
	if per_node == nil or per_node == "" then
		job_desc.tres_per_node = spec
	else
		job_desc.tres_per_node = per_node .. "," .. spec
	end
	return string.format("carma: admitted by GPU memory, %s:%d (%s)", scope.gres, gib, describe(scope))
end

-- One owner per GPU: a CARMA job must hold a GPU Slurm accounts for (gpu or
-- shard GRES, after the rewrite above), or its GPU-seconds would escape QOS
-- limits, fairshare and sacct. Returns the one line the user is told, or nil.
-- slurmstepd refuses such a step too (a job may set CARMA_* only in a step).
local function holds_gpu_gres(v)
	-- Items like "gres/gpu:1", "gres:gpu:a100:2", "gpu", "gres/shard=2":
	-- the name exactly (not "gpumem"), and a count above zero.
	for item in string.gmatch(v, "[^,]+") do
		local spec = string.gsub(item, "^gres[/:]", "")
		local name = string.match(spec, "^([^:=]+)")
		local count = tonumber(string.match(spec, "[:=](%d+)$") or "1")
		if (name == "gpu" or name == "shard") and count ~= nil and count > 0 then
			return true
		end
	end
	return false
end

local function unaccounted(job_desc)
	for _, field in ipairs({ "tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket", "gres" }) do
		local v = job_desc[field]
		if type(v) == "string" and holds_gpu_gres(v) then
			return nil
		end
	end
	return "carma: a --carma-* job must hold a GPU that Slurm accounts for: add --gres=shard:1 to share a GPU, or --gres=gpu:N for whole GPUs"
end

-- The GPUs or shards a GRES or TRES string asks for (items like
-- "gres/gpu:2", "gres:shard:4", "gpu:a100:2", "gpu"), summed.
local function gpu_units(v)
	local n = 0
	for item in string.gmatch(v, "[^,]+") do
		local spec = string.gsub(item, "^gres[/:]", "")
		local name = string.match(spec, "^([^:=]+)")
		if name == "gpu" or name == "shard" then
			n = n + (tonumber(string.match(spec, "[:=](%d+)$") or "1") or 0)
		end
	end
	return n
end

-- A step uses at most as many GPUs as Slurm allocated its job on a node
-- (one shard is at most one GPU's worth; slurmstepd refuses the rest, issue
-- 58). A job whose --carma-gpus exceeds every GPU or shard count it asks
-- Slurm for can never run: refused here with the one line the user is
-- told, or nil. Per-task and per-socket counts multiply: left to slurmstepd.
local function more_gpus_than_asked(job_desc)
	local want = tonumber(spank_env(job_desc, "CARMA_GPUS") or "") or 1
	if want <= 1 then
		return nil
	end
	for _, field in ipairs({ "tres_per_task", "tres_per_socket" }) do
		local v = job_desc[field]
		if type(v) == "string" and gpu_units(v) > 0 then
			return nil
		end
	end
	local most = 0
	for _, field in ipairs({ "tres_per_node", "tres_per_job", "gres" }) do
		local v = job_desc[field]
		if type(v) == "string" then
			most = math.max(most, gpu_units(v))
		end
	end
	if most >= want then
		return nil
	end
	return string.format("carma: --carma-gpus=%d asks for %d GPUs but the job asks Slurm for %d GPU(s) or shard(s) per node, and a shard is at most one GPU's worth: ask --gres=gpu:%d for %d GPUs",
		want, want, most, want, want)
end

local function record(job_desc, note, old_comment)
	local comment = old_comment
	if comment ~= nil and comment ~= "" then
		comment = comment .. "; " .. note
	else
		comment = note
	end
	job_desc.comment = comment
end

-- OOM recovery requeues a CARMA job from carma-epilog: the job must be
-- requeueable whatever the cluster's JobRequeue says, unless its user said
-- --no-requeue (or --requeue) themselves. Other jobs keep the site's default.
local function requeueable(job_desc)
	local unset16 = slurm.NO_VAL16 or 65534
	if job_desc.requeue == nil or job_desc.requeue == unset16 then
		job_desc.requeue = 1
	end
end

function carma.job_submit(job_desc, part_list, submit_uid)
	local job = {
		partition = job_desc.partition,
		account = job_desc.account or job_desc.default_account,
		qos = job_desc.qos or job_desc.default_qos,
	}
	local note, scope = rewrite(job_desc, job, part_list, job_desc.script ~= nil)
	if note ~= nil then
		record(job_desc, note, job_desc.comment)
		log_info("job from uid %s: %s", tostring(submit_uid), note)
	end
	local carma_job = note ~= nil
	for _, kv in pairs(job_desc.spank_job_env or {}) do
		carma_job = carma_job or string.sub(kv, 1, 6) == "CARMA_"
	end
	if carma_job then
		local refused = unaccounted(job_desc)
		if refused ~= nil then
			slurm.log_user("%s", refused)
			log_info("job from uid %s refused: no gpu or shard GRES", tostring(submit_uid))
			return slurm.ERROR
		end
		refused = more_gpus_than_asked(job_desc)
		if refused ~= nil then
			slurm.log_user("%s", refused)
			log_info("job from uid %s refused: more --carma-gpus than GPUs asked of Slurm", tostring(submit_uid))
			return slurm.ERROR
		end
		requeueable(job_desc)
		local admitted = admit(job_desc, job, part_list, scope and tonumber(scope.default_mib))
		if admitted ~= nil then
			record(job_desc, admitted, job_desc.comment)
			log_info("job from uid %s: %s", tostring(submit_uid), admitted)
		end
	end
	return slurm.SUCCESS
end

-- `scontrol update` of a pending job: a new GPU request in a scope gets the
-- same rewrite. A job moved into a scope keeps its whole GPUs: Slurm
-- refuses to turn a pending job's gpu into shard (measured on 22.05).
function carma.job_modify(job_desc, job_rec, part_list, modify_uid)
	local job = {
		partition = job_desc.partition or job_rec.partition,
		account = job_desc.account or job_rec.account,
		qos = job_desc.qos or job_rec.qos,
	}
	-- An update names only what changes (no script): a pending job started
	-- by srun or salloc being given GPUs is too rare to tell apart.
	local note = rewrite(job_desc, job, part_list, true)
	if note ~= nil then
		record(job_desc, note, job_desc.comment or job_rec.comment)
		log_info("job %s updated by uid %s: %s", tostring(job_rec.job_id), tostring(modify_uid), note)
	end
	return slurm.SUCCESS
end

-- cli_filter/lua, in srun: a step of a job that holds shards asks for
-- shards where it asks for GPUs.
function carma.cli_pre_submit(options, pack_offset)
	if options.type ~= "srun" or os.getenv("SLURM_JOB_ID") == nil or os.getenv("SLURM_SHARDS_ON_NODE") == nil then
		return slurm.SUCCESS
	end
	-- srun prefixes a bare "shard:N" with its release's spelling itself
	-- (gres_prepend_tres_type: "gres:" up to 23.02, "gres/" since 23.11).
	local spec = to_shards(options["gres"], "")
	if spec ~= nil then
		options["gres"] = spec
	end
	for _, key in ipairs({ "gpus", "gpus-per-node" }) do
		local n = tonumber(options[key])
		local gres = options["gres"]
		if n ~= nil and n > 0 and (gres == nil or not string.find(gres, "shard", 1, true)) then
			options["gres"] = (gres and gres .. "," or "") .. "shard:" .. n
			options[key] = ""
		end
	end
	return slurm.SUCCESS
end

return carma
