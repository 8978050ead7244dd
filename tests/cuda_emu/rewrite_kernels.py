#!/usr/bin/env python3
"""Rewrites CUDA kernel sources into C++ that g++ compiles for the emulator.

  rewrite_kernels.py SRC_DIR OUT_DIR [attention|elementwise|model|all]

SRC_DIR is src/kernels/cuda. "attention" (the default): OUT_DIR receives attention_tiles.cuh,
attention_forward.cc and attention_backward.cc. "elementwise": OUT_DIR receives cuda_util.cuh
and ELEMENTWISE's .cc files (rope.cc, rmsnorm.cc, ...). "model": OUT_DIR receives cuda_util.cuh
and MODEL's .cc files (embedding.cc, lm_head_loss.cc, and tensor_ops.cc for the loss's
conversions). "all": all of these in one OUT_DIR, every kernel of the backend (its GEMMs are
cuBLAS, not kernels of ours: the emulated build has emu_cublas.cc). These textual changes, nothing
else:
  - attention_tiles.cuh: the block between the "PTX primitives" markers is replaced by
    #include "emu_ptx_primitives.h" (CPU versions of the same functions), and its launch helper
    is rewritten as below;
  - every launch `kernel<<<grid, block, smem, stream>>>(args);` (kernel possibly a template-id,
    `name<T, 4>`) becomes `::emu::launch(kernel, grid, block, smem, stream, args);`;
  - every static shared array or variable `__shared__ T name[N]...;` / `__shared__ T name;`
    becomes `static T name[N]...; ::emu::shared_array(&name, sizeof(name));` (one copy for the
    fibers of a block, refilled with a NaN pattern at each block start; see emu_runtime.h);
  - "model" only: embedding.cu's `#include <cub/device/device_radix_sort.cuh>` becomes
    #include "emu_cub_radix_sort.h" (a host stand-in for cub::DeviceRadixSort::SortPairs).
A source whose markers or launches are missing fails the build, so a change to the kernels that
the emulator no longer understands cannot pass silently.
"""
import os
import re
import sys

BEGIN = '// ---- PTX primitives (sm_80+) ----'
END = '// ---- end PTX primitives ----'
LAUNCH = re.compile(r'(\w+(?:<[^<>;()]*>)?)<<<(.+?)>>>\((.*?)\);', re.S)
SHARED = re.compile(r'\b__shared__\s+([\w:<>, ]+?)\s+(\w+)((?:\[[^\]\[;]+\])*);')
CUB_SORT = '#include <cub/device/device_radix_sort.cuh>'
ELEMENTWISE = ('rope', 'rmsnorm', 'swiglu', 'tensor_ops', 'adamw')
MODEL = ('embedding', 'lm_head_loss', 'tensor_ops')


def write(path, text):
    with open(path, 'w') as f:
        f.write(text)


def rewrite_launches(src, name, ext, text=None, required=True):
    """The source src/name.ext (or `text` read from it and changed) with its launches rewritten,
    under a #line naming the original. required: a source without a launch fails the build."""
    path = os.path.join(src, name + ext)
    if text is None:
        with open(path) as f:
            text = f.read()
    text, n = LAUNCH.subn(r'::emu::launch(\1, \2, \3);', text)
    if n == 0 and required:
        sys.exit('rewrite_kernels.py: no kernel launch found in %s%s' % (name, ext))
    text = SHARED.sub(r'static \1 \2\3; ::emu::shared_array(&\2, sizeof(\2));', text)
    if '__shared__' in text:
        sys.exit('rewrite_kernels.py: a __shared__ declaration in %s%s has a form this script does not rewrite'
                 % (name, ext))
    if '<<<' in text:
        sys.exit('rewrite_kernels.py: a launch in %s%s has a form this script does not rewrite' % (name, ext))
    return '#line 1 "%s"\n' % path + text


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit('usage: rewrite_kernels.py SRC_DIR OUT_DIR [attention|elementwise|model]')
    src, out = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) == 4 else 'attention'
    os.makedirs(out, exist_ok=True)
    if mode not in ('attention', 'elementwise', 'model', 'all'):
        sys.exit('rewrite_kernels.py: unknown mode %s' % mode)
    if mode == 'all':
        covered = set(ELEMENTWISE) | set(MODEL) | {'attention_forward', 'attention_backward'}
        missing = sorted(f[:-3] for f in os.listdir(src) if f.endswith('.cu') and f[:-3] not in covered)
        if missing:
            sys.exit('rewrite_kernels.py: kernels the emulator does not know: %s (add them to a list here)'
                     % ', '.join(missing))
    if mode in ('elementwise', 'all'):
        write(os.path.join(out, 'cuda_util.cuh'), rewrite_launches(src, 'cuda_util', '.cuh'))
        for name in ELEMENTWISE:
            write(os.path.join(out, name + '.cc'), rewrite_launches(src, name, '.cu'))
    if mode in ('model', 'all'):
        write(os.path.join(out, 'cuda_util.cuh'), rewrite_launches(src, 'cuda_util', '.cuh'))
        for name in MODEL:
            text = rewrite_launches(src, name, '.cu')
            if name == 'embedding':
                if CUB_SORT not in text:
                    sys.exit('rewrite_kernels.py: embedding.cu lacks "%s"' % CUB_SORT)
                text = text.replace(CUB_SORT, '#include "emu_cub_radix_sort.h"')
            if name != 'embedding' and ('cub/' in text or 'cub::' in text):
                sys.exit('rewrite_kernels.py: %s.cu uses CUB beyond what the emulator stands in for' % name)
            write(os.path.join(out, name + '.cc'), text)
    if mode not in ('attention', 'all'):
        return

    with open(os.path.join(src, 'attention_tiles.cuh')) as f:
        tiles = f.read()
    a, b = tiles.find(BEGIN), tiles.find(END)
    if a < 0 or b < a:
        sys.exit('rewrite_kernels.py: attention_tiles.cuh lacks the markers "%s" ... "%s"' % (BEGIN, END))
    tiles = tiles[:a] + '#include "emu_ptx_primitives.h"\n' + tiles[b:]
    # The tiled launch helper lives in the header; the kernels' own launches in the .cu files.
    write(os.path.join(out, 'attention_tiles.cuh'), rewrite_launches(src, 'attention_tiles', '.cuh', tiles))

    for name in ('attention_forward', 'attention_backward'):
        write(os.path.join(out, name + '.cc'), rewrite_launches(src, name, '.cu', required=False))

if __name__ == '__main__':
    main()
