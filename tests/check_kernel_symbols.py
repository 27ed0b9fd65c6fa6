#!/usr/bin/env python3
"""Each per-instruction-set kernel library (lib/attnlab/kernels_isa.cpp compiled for one path)
must define exactly one global symbol, its table. Any other (an inline function or template
instance compiled with, say, AVX-512 flags) could be the copy the linker keeps for the whole
library and run on a CPU without those instructions. Symbols that carry no code are ignored:
the sanitizers' ODR markers (__odr_asan.*) and the pointer to the C++ personality routine
(DW.ref.__gxx_personality_v0), which every library's exception tables share.
Usage: check_kernel_symbols.py NM LIBRARY... (exit 0 when every library passes)"""
import re
import subprocess
import sys

nm, libraries = sys.argv[1], sys.argv[2:]
failed = False
for lib in libraries:
    out = subprocess.run([nm, "-g", "--defined-only", lib], check=True, capture_output=True,
                         text=True).stdout
    symbols = [line.split()[-1] for line in out.splitlines() if len(line.split()) == 3]
    symbols = [s for s in symbols if not s.startswith(("__odr_asan", "DW.ref."))]
    tables = [s for s in symbols if re.fullmatch(r"_ZN7attnlab7kernels6detail\d+\w+_tableE", s)]
    if len(tables) != 1 or len(symbols) != 1:
        failed = True
        print(f"{lib}: expected one global symbol, its table; found {len(symbols)}:")
        for s in symbols:
            print("  ", s)
    else:
        print(f"{lib}: only {tables[0]}")
sys.exit(1 if failed else 0)
