#!/usr/bin/env bash
# The device's exp and log (src/device/kernels/dmath.cl) against the library's
# (dmath::Exp / dmath::Log: SLEEF's deterministic family) on all 2^32 inputs, bit for bit, on
# the first OpenCL device (PoCL here). Too long for CI (which runs a sample of ~1.1M inputs);
# about 10 minutes on 2 cores. Needs build/ (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build/tests/device_tests --gtest_also_run_disabled_tests \
  --gtest_filter='DeviceTest.DISABLED_ExpAndLogGiveTheLibrarysBitsOnEveryFloat'
