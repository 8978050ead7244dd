#!/usr/bin/env python3
"""Refuses an include that goes up a layer.

  check_layers.py ROOT LAYER...    (lowest layer first, e.g. core device ... train cli)

Every file under ROOT/src/<layer>/ and ROOT/include/untied/<layer>/ may include headers of its own
layer and of the layers before it in the list: "untied/<layer>/..." (public headers) or
"<layer>/..." (the private headers under src/). The backends (src/backends/cuda/ and
src/backends/nccl/) are the layer named "backends": they implement the device, kernels and comm
interfaces, so they sit above those layers. An include of a later layer
is an error; each is printed as file:line with both layers, and the exit status is 1. The build
runs this before it compiles anything (CMakeLists.txt), so such an include fails the build.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(parts, rank):
    """The layer of a path under src/ or include/untied/, as components: its first folder."""
    return parts[0]


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    root, layers = sys.argv[1], sys.argv[2:]
    rank = {name: i for i, name in enumerate(layers)}
    errors = []
    for layer in layers:
        for base in (os.path.join(root, 'src', layer), os.path.join(root, 'include', 'untied', layer)):
            for dirpath, _, files in os.walk(base):
                for name in sorted(files):
                    path = os.path.join(dirpath, name)
                    own = layer_of(os.path.relpath(path, os.path.dirname(base)).split(os.sep), rank)
                    with open(path, errors='replace') as f:
                        for lineno, line in enumerate(f, 1):
                            m = INCLUDE.match(line)
                            if not m:
                                continue
                            parts = m.group(1).split('/')
                            target = layer_of(parts[1:] if parts[0] == 'untied' else parts, rank)
                            if target in rank and rank[target] > rank[own]:
                                errors.append('%s:%d: the %s layer includes "%s" of the %s layer above it'
                                              % (os.path.relpath(path, root), lineno, own, m.group(1), target))
    if errors:
        print('\n'.join(errors), file=sys.stderr)
        print('layering: %d include(s) go up a layer (order, lowest first: %s); move the code or the '
              'dependency down' % (len(errors), ' < '.join(layers)), file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
