# Sourced (bash) on a machine without a package registry, such as the GPU machine: where Open MPI,
# OpenBLAS, GoogleTest, nlohmann-json, CLI11, PCRE2, utf8proc or pkg-config is missing and .gpu-deps/*.deb (made by scripts/gpu-deps) is present, it
# unpacks those packages with dpkg -x into a prefix, $UNTIED_DEPS_PREFIX (default /tmp/untied-deps;
# never /), and exports what the build and the tests need from there: PATH, LD_LIBRARY_PATH, the
# relocation variables of Open MPI (OPAL_*) and PMIx (PMIX_*), and UNTIED_CMAKE_ARGS, the -D hints
# to pass to cmake. Where all three are installed already it changes nothing and leaves
# UNTIED_CMAKE_ARGS empty. Returns non-zero when something is missing and cannot be supplied.
#   source scripts/gpu-env.sh && cmake -S . -B build $UNTIED_CMAKE_ARGS
# Library packages other than Open MPI, PMIx, OpenBLAS and GoogleTest are unpacked only where the
# system lacks their libraries (ldconfig -p), so that newer system copies are not shadowed.
# The prefix path must not contain spaces.

# Whether $1 is an executable on PATH (type -P alone also names a file that cannot be executed).
_untied_exe() { local p; p=$(type -P "$1") && [ -x "$p" ]; }

_untied_system_has_deps() {
  _untied_exe mpicxx && _untied_exe mpirun || return 1
  [ -e /usr/include/gtest/gtest.h ] || return 1
  [ -e /usr/include/nlohmann/json.hpp ] || return 1
  [ -e /usr/include/CLI/CLI.hpp ] || return 1
  _untied_exe pkg-config && [ -e /usr/include/pcre2.h ] && [ -e /usr/include/utf8proc.h ] || return 1
  [ -e /usr/include/zlib.h ] && [ -e /usr/include/zstd.h ] || return 1
  compgen -G "/usr/lib/x86_64-linux-gnu/openblas*/libopenblas.so" >/dev/null ||
    [ -e /usr/lib/x86_64-linux-gnu/libopenblas.so ] || return 1
  local d
  for d in /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/x86_64-linux-gnu/openblas-pthread \
           /usr/include/openblas /usr/include; do
    [ -e "$d/cblas.h" ] && return 0
  done
  return 1
}

# Unpacks one .deb into a folder: dpkg-deb where there is one, else ar and tar.
_untied_unpack_deb() {
  if _untied_exe dpkg-deb; then
    dpkg-deb -x "$1" "$2"
  else
    local member
    member=$(ar t "$1" | grep '^data\.tar') || return 1
    ar p "$1" "$member" | tar -x -C "$2" $(case $member in *.xz) echo -J;; *.gz) echo -z;;
                                                        *.zst) echo --zstd;; esac)
  fi
}

_untied_gpu_env() {
  local root debdir prefix ldcache stamp f pkg stage sonames name missing
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  debdir=$root/.gpu-deps
  UNTIED_CMAKE_ARGS=""
  if _untied_system_has_deps; then
    return 0
  fi
  if ! compgen -G "$debdir/*.deb" >/dev/null; then
    echo "gpu-env: Open MPI, OpenBLAS or GoogleTest is missing and $debdir/ holds no packages" \
         "(make them with scripts/gpu-deps where apt works)" >&2
    return 1
  fi
  prefix=${UNTIED_DEPS_PREFIX:-/tmp/untied-deps}
  case $prefix in
    /*) ;;
    *) echo "gpu-env: UNTIED_DEPS_PREFIX must be an absolute path" >&2; return 1 ;;
  esac
  prefix=$(realpath -m "$prefix")
  case $prefix in
    /|/usr|/usr/local|/opt|/tmp|*' '*)
      echo "gpu-env: refusing to unpack into '$prefix'" >&2; return 1 ;;
  esac

  stamp=$(cd "$debdir" && ls -l --time-style=+%s -- *.deb | awk '{print $5, $6, $7}')
  if [ ! -f "$prefix/.untied-debs" ] || [ "$(cat "$prefix/.untied-debs")" != "$stamp" ]; then
    if [ -e "$prefix" ] && [ ! -f "$prefix/.untied-prefix" ] && [ -n "$(ls -A "$prefix")" ]; then
      echo "gpu-env: $prefix exists and was not made here; set UNTIED_DEPS_PREFIX" >&2; return 1
    fi
    rm -rf "$prefix"
    mkdir -p "$prefix" && touch "$prefix/.untied-prefix" || return 1
    ldcache=$(ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null || true)
    for f in "$debdir"/*.deb; do
      pkg=$(basename "$f"); pkg=${pkg%%_*}
      stage=$prefix/.stage/$pkg
      mkdir -p "$stage"
      _untied_unpack_deb "$f" "$stage" || { echo "gpu-env: cannot unpack $f" >&2; return 1; }
      case $pkg in
        # Always from the prefix (the -dev packages' links name these exact files).
        libopenmpi*|openmpi-*|libpmix*|libopenblas*|libgtest-dev|libpcre2-8-0|libutf8proc2) ;;
        make)
          if _untied_exe make; then rm -rf "$stage"; continue; fi ;;
        *)
          # A support library: skip it where the system has every soname it ships.
          sonames=$(find "$stage"/usr/lib/x86_64-linux-gnu "$stage"/lib/x86_64-linux-gnu \
                      -maxdepth 1 -name 'lib*.so.*' 2>/dev/null | sed 's|.*/||' |
                    grep -E '\.so\.[0-9]+$' || true)
          if [ -n "$sonames" ]; then
            missing=0
            for name in $sonames; do
              grep -qE "^[[:space:]]+${name//./\\.} \(" <<<"$ldcache" || { missing=1; break; }
            done
            if [ $missing = 0 ]; then rm -rf "$stage"; continue; fi
          fi ;;
      esac
      cp -a "$stage"/. "$prefix"/ && rm -rf "$stage" || return 1
    done
    rm -rf "$prefix/.stage"
    # The links that update-alternatives makes on an installed system.
    for name in mpirun mpiexec mpicc mpicxx mpic++ mpiCC; do
      if [ -e "$prefix/usr/bin/$name.openmpi" ]; then ln -sfn "$name.openmpi" "$prefix/usr/bin/$name"; fi
    done
    for f in "$prefix"/usr/lib/libpsm1/libpsm_infinipath.so.1.*; do
      if [ -e "$f" ]; then ln -sfn "../libpsm1/${f##*/}" "$prefix/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"; fi
    done
    echo "$stamp" > "$prefix/.untied-debs"
    echo "gpu-env: unpacked $(ls "$debdir"/*.deb | wc -l) packages from $debdir into $prefix" >&2
  fi

  local lib=$prefix/usr/lib/x86_64-linux-gnu
  export PATH=$prefix/usr/bin:$PATH
  export LD_LIBRARY_PATH=$lib:$lib/openblas-openmp:$lib/openmpi/lib:$lib/pmix2/lib:$prefix/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  # Open MPI (Debian: prefix /usr, libdir and includes under /usr/lib/<arch>/openmpi, components in
  # .../openmpi/lib/openmpi3, wrapper data and help in /usr/share/openmpi, settings in /etc/openmpi):
  # all but the settings folder follow OPAL_PREFIX.
  export OPAL_PREFIX=$prefix/usr
  export OPAL_SYSCONFDIR=$prefix/etc/openmpi
  # PMIx (Debian: everything under /usr/lib/<arch>/pmix2, compiled in as absolute paths).
  export PMIX_PREFIX=$lib/pmix2 PMIX_EXEC_PREFIX=$lib/pmix2 PMIX_LIBDIR=$lib/pmix2/lib
  export PMIX_INCLUDEDIR=$lib/pmix2/include PMIX_DATAROOTDIR=$lib/pmix2/share
  export PMIX_DATADIR=$lib/pmix2/share PMIX_SYSCONFDIR=$lib/pmix2/share
  export PMIX_PKGLIBDIR=$lib/pmix2/lib/pmix PMIX_PKGDATADIR=$lib/pmix2/share/pmix
  export PMIX_MCA_mca_base_component_path=$lib/pmix2/lib/pmix
  # Without ssh, mpirun would refuse to start even for ranks on this host only.
  if ! _untied_exe ssh && ! _untied_exe rsh; then
    export OMPI_MCA_plm_rsh_agent=false
  fi
  # PCRE2 and utf8proc through pkg-config (pkgconf from the prefix): their .pc files name /usr,
  # which the sysroot moves into the prefix.
  export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
  UNTIED_CMAKE_ARGS="-DMPI_CXX_COMPILER=$prefix/usr/bin/mpicxx"
  UNTIED_CMAKE_ARGS+=" -DMPIEXEC_EXECUTABLE=$prefix/usr/bin/mpirun -DMPIEXEC_PROGRAM=$prefix/usr/bin/mpirun"
  UNTIED_CMAKE_ARGS+=" -DOPENBLAS_INCLUDE_DIR=$prefix/usr/include/x86_64-linux-gnu/openblas-openmp"
  UNTIED_CMAKE_ARGS+=" -DOPENBLAS_LIBRARY=$lib/openblas-openmp/libopenblas.so"
  UNTIED_CMAKE_ARGS+=" -DGTest_DIR=$lib/cmake/GTest"
  UNTIED_CMAKE_ARGS+=" -Dnlohmann_json_DIR=$prefix/usr/share/cmake/nlohmann_json"
  UNTIED_CMAKE_ARGS+=" -DCLI11_DIR=$prefix/usr/share/cmake/CLI11"
  export UNTIED_CMAKE_ARGS UNTIED_DEPS_PREFIX=$prefix
}

_untied_gpu_env
