#!/usr/bin/env bash
# The device's exp and log (src/device/kernels/dmath.cl) against the library's
# (dmath::Exp / dmath::Log: SLEEF's deterministic family) on all 2^32 inputs, bit for bit, on
# the first OpenCL device (PoCL here). Too long for CI (which runs a sample of ~1.1M inputs):
# 13 minutes on PoCL on a 2-core Xeon (passed: every one of the 2^32 inputs equal). Needs build/ (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build/tests/device_tests --gtest_also_run_disabled_tests \
  --gtest_filter='DeviceTest.DISABLED_ExpAndLogGiveTheLibrarysBitsOnEveryFloat'
