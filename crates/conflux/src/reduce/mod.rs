//! Reduction kernels: AVX2 when the CPU has it, portable code otherwise.
