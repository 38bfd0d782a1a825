// PIPELSTM_CPU_CLONES: a float entry point compiled for several instruction
// sets at once (target_clones), the best one picked when the library loads,
// so the binary runs on any x86-64 and still uses AVX-512 where it exists.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PIPELSTM_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define PIPELSTM_CPU_CLONES
#endif
