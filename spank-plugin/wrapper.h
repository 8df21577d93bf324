#include <slurm/slurm_version.h>
#include <slurm/spank.h>
