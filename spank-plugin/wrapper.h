#include <slurm/slurm_version.h>
#include <slurm/slurm.h>
#include <slurm/spank.h>
