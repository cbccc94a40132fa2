"""The CUDA library lookup's rules as data, each with where it was read: where driver libraries live, which
CUDA sonames carry the CUDA major in their number, and where triton keeps its libcuda lookup (the lookup
itself is read from the installed triton, see zdoctor/layers/cuda_lookup/cudalookup.py)."""

from __future__ import annotations

#: Where driver installers and container runtimes put libcuda.so.1 (searched besides the cache): the
#: distribution's library directories, RHEL/Fedora's (and rpmfusion's) nvidia subdirectories, the NVIDIA
#: container runtime's and GKE's mount point, WSL's, NixOS's driver link and Debian's old alternative dir.
DRIVER_DIRS: tuple[str, ...] = (
    "/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib",
    "/usr/lib64/nvidia", "/usr/lib/nvidia", "/usr/lib/x86_64-linux-gnu/nvidia/current",
    "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib", "/run/opengl-driver/lib",
    "/usr/local/cuda/compat",
)
DRIVER_DIRS_SOURCES = (
    "NVIDIA driver installation guide: the driver's libraries go to the distribution's library directory",
    "NVIDIA Container Toolkit / GKE: the host's driver libraries are mounted at /usr/local/nvidia/lib64",
    "CUDA forward compatibility: the cuda-compat package installs libcuda.so.1 in /usr/local/cuda/compat",
)

#: CUDA libraries whose SONAME number is the CUDA major they belong to (``libcudart.so.12`` is CUDA 12's;
#: CUDA 11 named it ``libcudart.so.11.0``): the runtime, cuBLAS, NVRTC and nvJitLink. Other CUDA libraries
#: (cuFFT 11 is CUDA 12's, cuRAND 10 spans CUDA 10-12, cuDNN has its own release) are only checked for
#: being found, not for their number.
MAJOR_IS_CUDA = ("libcudart", "libcublas", "libcublasLt", "libnvrtc", "libnvJitLink")
MAJOR_IS_CUDA_SOURCES = (
    "CUDA Toolkit: libcudart.so.<major> (libcudart.so.11.0 for CUDA 11), libcublas/libcublasLt.so.<major>, "
    "libnvrtc.so.<major> (libnvrtc.so.11.2 for CUDA 11.2+), libnvJitLink.so.<major> (CUDA 12+)",
    "PyPI nvidia-cuda-runtime-cu12 ships nvidia/cuda_runtime/lib/libcudart.so.12 (cu11: libcudart.so.11.0)",
)
#: Every CUDA library family an extension may need (the name before ``.so``).
CUDA_FAMILIES = MAJOR_IS_CUDA + ("libcusparse", "libcusparseLt", "libcufft", "libcufftw", "libcurand",
                                 "libcusolver", "libcusolverMg", "libcudnn", "libcupti", "libnvToolsExt",
                                 "libcufile", "libnccl", "libnvjpeg", "libnpp")

#: Where triton's libcuda lookup lives: 3.x's NVIDIA backend, 2.x's common build module.
TRITON_FILES = ("backends/nvidia/driver.py", "common/build.py", "runtime/build.py")
TRITON_SOURCES = (
    "triton third_party/nvidia/backend/driver.py libcuda_dirs(): TRITON_LIBCUDA_PATH, else the `/sbin/ldconfig "
    "-p` lines naming libcuda.so.1, else LD_LIBRARY_PATH; \"libcuda.so cannot found!\"; the launcher is then "
    "built with -lcuda and -L those directories (python/triton/runtime/build.py _build)",
    "triton 2.1 python/triton/common/build.py libcuda_dirs(): the `ldconfig -p` lines naming libcuda.so, and "
    "an assertion that an unversioned libcuda.so exists in one of their directories (triton PR #1981)",
    "triton PR #2582 (TRITON_LIBCUDA_PATH), PR #2883 (the LD_LIBRARY_PATH fallback), PR #8668 (link "
    "libcuda.so.1 instead of -lcuda)",
)
