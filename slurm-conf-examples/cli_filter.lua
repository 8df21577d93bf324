-- /etc/slurm/cli_filter.lua on every submit host and node (slurm.conf:
-- CliFilterPlugins=lua), for a site without a cli_filter.lua of its own.
-- A site that has one adds the dofile line and the carma.cli_pre_submit call.
local carma = dofile("/usr/share/carma-slurm/carma_slurm.lua")

function slurm_cli_setup_defaults(options, early_pass)
	return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
	return carma.cli_pre_submit(options, pack_offset)
end

function slurm_cli_post_submit(offset, jobid, stepid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
