// The test-only device fault (LLORCH_TEST_DEVICE_FAULT, specs/CUDA.md): one thread writes
// through `target`, an address no allocation holds, so the kernel faults and the context gets
// CUDA's sticky "illegal address" error. Compiled as a program of its own, only when the
// trigger is set: never part of the worker's kernels.
extern "C" __global__ void llorch_test_fault(float* target) {
    *(volatile float*)target = 1.0f;
}
