# Sourced by scripts/gpu-check and scripts/gpu-pack: the binaries a GPU check runs, as paths in
# the build folder (their build targets are the file names); wgmma_layout_test is added where the
# build has the sm_90a kernels.
UNTIED_GPU_BINARIES=(untied tests/cuda/cuda_test tests/cuda/cuda_train_test tests/cuda/cuda_nccl_test
                     tests/attention/attention_gpu_test tests/ops/backend_ops_test tests/nccl/nccl_mpi_test)
