// The little MPI the sweep needs (`attnlab sweep --mpi`): rank 0 owns the result directory,
// broadcasts the keys already done, and receives every other rank's rows as CSV lines, appending
// them as they arrive. Built only when meson finds MPI (option `mpi`); otherwise every function
// but available() throws Error.
#pragma once

#include <string>

namespace attnlab::harness::mpi {

bool available();
void init();           // MPI_Init unless already initialised
void finalize();       // MPI_Finalize unless already finalised
void abort(int code);  // MPI_Abort: one rank's failure ends every rank instead of a hang
int rank();
int size();
void broadcast(std::string& text);           // rank 0's text to every rank
void send_row(const std::string& csv_line);  // to rank 0
void send_done();                            // this rank has no more rows
/// Rank 0: the next message from another rank; `done` tells which kind. With block = false
/// returns false when nothing is pending.
bool receive(std::string& csv_line, bool& done, bool block);
void barrier();

}  // namespace attnlab::harness::mpi
