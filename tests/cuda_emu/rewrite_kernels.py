#!/usr/bin/env python3
"""Rewrites the CUDA attention kernels into C++ that g++ compiles for the emulator.

  rewrite_kernels.py SRC_DIR OUT_DIR

SRC_DIR is src/kernels/cuda; OUT_DIR receives attention_tiles.cuh, attention_forward.cc and
attention_backward.cc. Two textual changes, nothing else:
  - attention_tiles.cuh: the block between the "PTX primitives" markers is replaced by
    #include "emu_ptx_primitives.h" (CPU versions of the same functions);
  - attention_*.cu: every launch `kernel<<<grid, block, smem, stream>>>(args);` becomes
    `::emu::launch(kernel, grid, block, smem, stream, args);`.
A source whose markers or launches are missing fails the build, so a change to the kernels that
the emulator no longer understands cannot pass silently.
"""
import os
import re
import sys

BEGIN = '// ---- PTX primitives (sm_80+) ----'
END = '// ---- end PTX primitives ----'
LAUNCH = re.compile(r'(\w+)<<<(.+?)>>>\((.*?)\);', re.S)


def write(path, text):
    with open(path, 'w') as f:
        f.write(text)


def main():
    if len(sys.argv) != 3:
        sys.exit('usage: rewrite_kernels.py SRC_DIR OUT_DIR')
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)

    with open(os.path.join(src, 'attention_tiles.cuh')) as f:
        tiles = f.read()
    a, b = tiles.find(BEGIN), tiles.find(END)
    if a < 0 or b < a:
        sys.exit('rewrite_kernels.py: attention_tiles.cuh lacks the markers "%s" ... "%s"' % (BEGIN, END))
    tiles = tiles[:a] + '#include "emu_ptx_primitives.h"\n' + tiles[b:]
    write(os.path.join(out, 'attention_tiles.cuh'), tiles)

    for name in ('attention_forward', 'attention_backward'):
        with open(os.path.join(src, name + '.cu')) as f:
            text = f.read()
        text, n = LAUNCH.subn(r'::emu::launch(\1, \2, \3);', text)
        if n == 0:
            sys.exit('rewrite_kernels.py: no kernel launch found in %s.cu' % name)
        if '<<<' in text:
            sys.exit('rewrite_kernels.py: a launch in %s.cu has a form this script does not rewrite' % name)
        write(os.path.join(out, name + '.cc'), '#line 1 "%s"\n' % os.path.join(src, name + '.cu') + text)


if __name__ == '__main__':
    main()
