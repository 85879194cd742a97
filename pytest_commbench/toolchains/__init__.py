"""Each vendor's toolchain: how a native solution is built for its GPUs (`nvidia`: nvcc; `amd`:
ROCm's or Debian's clang), on the machinery every recipe shares (`..build`). A vendor's
platform (`platforms.nvidia`, `platforms.amd`) builds through its toolchain; `build` imports
none of them."""
