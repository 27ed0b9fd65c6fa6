// Heap accounting for the sweep's peak_mem_bytes column. harness/heap.cpp replaces the global
// operator new and delete (every form, aligned ones included) of any program that links the
// harness: each allocation adds malloc_usable_size() bytes to a live counter and raises a peak
// (atomics, so OpenMP threads are counted). What it sees: everything allocated with new, which
// includes xtensor tensors and std containers in attnlab and its variants. What it does not see:
// memory from malloc or mmap called directly (OpenBLAS's buffers, OpenMP stacks).
#pragma once

#include <cstdint>

namespace attnlab::harness::heap {

/// Bytes allocated with operator new and not yet freed.
std::int64_t live_bytes();

/// Restarts the peak at the current live bytes; peak_since_reset() - live at reset is then the
/// extra peak of what ran in between.
void reset_peak();
std::int64_t peak_bytes();

/// False in a program whose operator new is not the harness's (never expected; tested).
bool counting();

}  // namespace attnlab::harness::heap
