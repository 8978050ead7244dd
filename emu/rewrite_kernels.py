#!/usr/bin/env python3
"""Rewrites the CUDA kernel sources into C++ that g++ compiles for the emulator.

  rewrite_kernels.py SRC_DIR OUT_DIR

SRC_DIR is src/backends/cuda. OUT_DIR receives cuda_util.cuh, attention_tiles.cuh, wgmma.cuh and one .cc
per .cu file: every kernel of the backend (its GEMMs are cuBLAS, not kernels of ours: the
emulated build has emu_cublas.cc). These textual changes, nothing else:
  - attention_tiles.cuh: the block between the "PTX primitives" markers is replaced by
    #include "emu_ptx_primitives.h" (CPU versions of the same functions);
  - every launch `kernel<<<grid, block, smem, stream>>>(args);` (kernel possibly qualified or a
    template-id, `ns::name<T, 4>`) becomes `::emu::launch(kernel, grid, block, smem, stream, args);`;
  - every static shared array or variable `__shared__ T name[N]...;` / `__shared__ T name;`
    becomes `static T name[N]...; ::emu::shared_array(&name, sizeof(name));` (one copy for the
    fibers of a block, refilled with a NaN pattern at each block start; see emu_runtime.h);
  - wgmma.cuh: the block between its "wgmma primitives" markers is replaced by
    #include "emu_wgmma_primitives.h" (CPU versions of the Hopper instructions);
  - the Hopper kernels (*_sm90.cu) start with #define UNTIED_SM90A_KERNELS 1, as their sm_90a
    build defines it, so that an emulated compute capability 9.0 device runs them where they are
    asked for;
  - embedding.cu's `#include <cub/device/device_radix_sort.cuh>` becomes
    #include "emu_cub_radix_sort.h" (a host stand-in for cub::DeviceRadixSort::SortPairs).
A source whose markers or launches are missing, or a .cu file this script does not list, fails
the build, so a change to the kernels that the emulator no longer understands cannot pass
silently.
"""
import os
import re
import sys

BEGIN = '// ---- PTX primitives (sm_80+) ----'
END = '// ---- end PTX primitives ----'
LAUNCH = re.compile(r'((?:\w+::)*\w+(?:<[^<>;()]*>)?)<<<(.+?)>>>\((.*?)\);', re.S)
SHARED = re.compile(r'\b__shared__\s+([\w:<>, ]+?)\s+(\w+)((?:\[[^\]\[;]+\])*);')
WG_BEGIN = '// ---- wgmma primitives (sm_90a) ----'
WG_END = '// ---- end wgmma primitives ----'
CUB_SORT = '#include <cub/device/device_radix_sort.cuh>'
KERNELS = ('attention_forward', 'attention_forward_sm90', 'attention_backward', 'attention_backward_sm90', 'rope', 'rmsnorm', 'swiglu', 'tensor_ops', 'adamw',
           'embedding', 'lm_head_loss', 'moe')


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
    if len(sys.argv) != 3:
        sys.exit('usage: rewrite_kernels.py SRC_DIR OUT_DIR')
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    missing = sorted(f[:-3] for f in os.listdir(src) if f.endswith('.cu') and f[:-3] not in KERNELS)
    if missing:
        sys.exit('rewrite_kernels.py: kernels the emulator does not know: %s (add them to KERNELS here)'
                 % ', '.join(missing))

    write(os.path.join(out, 'cuda_util.cuh'), rewrite_launches(src, 'cuda_util', '.cuh'))
    with open(os.path.join(src, 'attention_tiles.cuh')) as f:
        tiles = f.read()
    a, b = tiles.find(BEGIN), tiles.find(END)
    if a < 0 or b < a:
        sys.exit('rewrite_kernels.py: attention_tiles.cuh lacks the markers "%s" ... "%s"' % (BEGIN, END))
    tiles = tiles[:a] + '#include "emu_ptx_primitives.h"\n' + tiles[b:]
    # The tiled launch helper lives in the header; the attention kernels' launches go through it.
    write(os.path.join(out, 'attention_tiles.cuh'), rewrite_launches(src, 'attention_tiles', '.cuh', tiles))
    with open(os.path.join(src, 'wgmma.cuh')) as f:
        wg = f.read()
    a, b = wg.find(WG_BEGIN), wg.find(WG_END)
    if a < 0 or b < a:
        sys.exit('rewrite_kernels.py: wgmma.cuh lacks the markers "%s" ... "%s"' % (WG_BEGIN, WG_END))
    resume = '#line %d "%s"\n' % (wg[:b].count('\n') + 1, os.path.join(src, 'wgmma.cuh'))
    wg = wg[:a] + '#include "emu_wgmma_primitives.h"\n' + resume + wg[b:]
    write(os.path.join(out, 'wgmma.cuh'), rewrite_launches(src, 'wgmma', '.cuh', wg, required=False))

    for name in KERNELS:
        text = rewrite_launches(src, name, '.cu', required=not name.startswith('attention_'))
        if name == 'embedding':
            if CUB_SORT not in text:
                sys.exit('rewrite_kernels.py: embedding.cu lacks "%s"' % CUB_SORT)
            text = text.replace(CUB_SORT, '#include "emu_cub_radix_sort.h"')
        elif name.endswith('_sm90'):
            text = '#define UNTIED_SM90A_KERNELS 1\n' + text
        if name != 'embedding' and ('cub/' in text or 'cub::' in text):
            sys.exit('rewrite_kernels.py: %s.cu uses CUB beyond what the emulator stands in for' % name)
        write(os.path.join(out, name + '.cc'), text)


if __name__ == '__main__':
    main()
