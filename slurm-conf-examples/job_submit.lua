-- /etc/slurm/job_submit.lua (next to slurm.conf; slurm.conf: JobSubmitPlugins=lua)
-- for a site without a job_submit.lua of its own. A site that has one adds
-- the dofile line and the two carma.* calls to its own functions.
local carma = dofile("/usr/share/carma-slurm/carma_slurm.lua")

function slurm_job_submit(job_desc, part_list, submit_uid)
	return carma.job_submit(job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return carma.job_modify(job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
