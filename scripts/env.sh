# Sourced by the scripts: lets mpirun start as root (containers, fresh servers) and place more
# ranks than cores, and gives every rank one BLAS/OpenMP thread unless the caller chose.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
