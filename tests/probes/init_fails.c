/*
 * A SPANK plugin whose slurm_spank_init fails in slurmstepd (remote
 * context) and nowhere else: tests/measure-init-failure.sh loads it as a
 * `required` plugin to see what each Slurm release does with such a
 * failure, with and without slurm_spank_init_failure_mode (25.05+).
 * Built with -DJOB_FAILURE to export ESPANK_JOB_FAILURE as CARMA does.
 * A measurement probe; never installed.
 */
#include <slurm/spank.h>

SPANK_PLUGIN(carma_probe, 1);

#ifdef JOB_FAILURE
int slurm_spank_init_failure_mode = ESPANK_JOB_FAILURE;
#endif

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp)) {
		slurm_error("carma_probe: init fails in slurmstepd on purpose");
		return -1;
	}
	return 0;
}
