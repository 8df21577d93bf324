# Packages for admins, built against the Slurm found at SLURM_PREFIX (SchedMD's
# layout: include/slurm/, lib/slurm/libslurmfull.so, bin/scontrol; slurm-devel
# installs under /usr), else this machine's /usr/include/slurm (libslurm-dev):
#
#   make deb [SLURM_PREFIX=/opt/slurm]  target/debian/carma-slurm_*+slurmSERIES_*.deb
#   make rpm [SLURM_PREFIX=/opt/slurm]  target/rpm/carma-slurm-*.slurmSERIES.*.rpm
#            [SLURM_REQUIRES=0]         (no Slurm package requirement: tarball installs)
#
# With SLURM_PREFIX, CARMA runs Slurm's commands from SLURM_PREFIX/bin
# (carma.yaml's slurm_bin_dir overrides it). Needs cargo, clang; rpm needs rpmbuild.
SLURM_PREFIX ?=
SLURM_REQUIRES ?= 1
INCLUDE := $(if $(SLURM_PREFIX),$(SLURM_PREFIX)/include,/usr/include)
export SLURM_PREFIX
export CARMA_SLURM_BIN_DIR := $(if $(SLURM_PREFIX),$(SLURM_PREFIX)/bin,)
SERIES = $(shell packaging/slurm-series.sh $(INCLUDE))

.PHONY: build deb rpm
# build-plugin.sh builds the whole workspace (release), then the plugin for the series.
build:
	packaging/build-plugin.sh $(INCLUDE)

deb: build
	CARMA_SLURM_SERIES=$(SERIES) CARMA_DEB_SLURM_REQUIRES=$(SLURM_REQUIRES) packaging/build-deb.sh

rpm: build
	CARMA_SLURM_SERIES=$(SERIES) CARMA_RPM_SLURM_REQUIRES=$(SLURM_REQUIRES) packaging/build-rpm.sh
