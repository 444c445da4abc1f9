# The one place where floating-point and ISA flags are set (see docs/numerics.md).
#
# The numerics contract requires that every multiply-add the compiler emits is the one the
# source wrote: no contraction of a*b+c into an FMA (-ffp-contract=off), no reassociation
# (no -ffast-math and none of its parts), IEEE subnormals (no -ffast-math => no FTZ/DAZ at
# startup). Library code is compiled for the baseline ISA only; SIMD variants are compiled per
# target by Highway and selected at run time.
set(LOCKSTEP_FP_FLAGS -ffp-contract=off -fno-fast-math)

# Highway: never build the HWY_SCALAR target (FixedTag kernels do not compile for it), and
# skip the 128-bit x86 targets whose MulAdd is not fused (SSSE3/SSE4): lockstep never
# dispatches to a target without a fused multiply-add (docs/numerics.md, "SIMD targets").
# EMU128 stays the compiled baseline that Highway requires, but is never dispatched. AVX3_DL
# (AVX-512 with VNNI, VBMI2 and friends: Ice Lake, Zen 4 and later) is a variant of its own
# (HWY_WANT_AVX3_DL): its int8 GEMM uses vpdpbusd (docs/numerics.md, "Int8"). On AArch64
# only NEON is admitted: the SVE targets are not compiled (their vectors are sizeless, and the
# kernels keep register tiles in arrays of vectors).
set(LOCKSTEP_HWY_DEFINES
    HWY_DISABLED_TARGETS=HWY_SCALAR|HWY_SSSE3|HWY_SSE4|HWY_SVE|HWY_SVE2|HWY_SVE_256|HWY_SVE2_128
    HWY_WANT_AVX3_DL HWY_BROKEN_EMU128=0)

function(lockstep_numerics target)
  target_compile_options(${target} PRIVATE ${LOCKSTEP_FP_FLAGS})
  target_compile_definitions(${target} PRIVATE ${LOCKSTEP_HWY_DEFINES})
endfunction()

# -DLOCKSTEP_SANITIZE=ON: AddressSanitizer + UndefinedBehaviorSanitizer on everything
# (scripts/sanitize.sh builds build-asan with it and runs the whole suite). The FP flags above
# stay: the sanitized build must give the same bits.
option(LOCKSTEP_SANITIZE "build with -fsanitize=address,undefined" OFF)
if(LOCKSTEP_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer
                      -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

# -DLOCKSTEP_WERROR=ON: -Wall -Wextra -Werror on lockstep's own targets (scripts/test.sh, and so
# CI, builds with it on GCC and Clang). Third-party headers are system includes, never warned on.
option(LOCKSTEP_WERROR "compile lockstep's own code with -Wall -Wextra -Werror" OFF)
if(LOCKSTEP_WERROR)
  add_compile_options(-Wall -Wextra -Werror)
  # GCC 12 at -O3 reports std::string appends and vector writes it cannot bound as overlapping
  # or overflowing (GCC bugs 105329, 105651): false positives in libstdc++'s own code.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    add_compile_options(-Wno-restrict -Wno-stringop-overflow)
  endif()
endif()
