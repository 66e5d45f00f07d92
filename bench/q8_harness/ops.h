// Stand-in for specserve/kernels/ops.h without torch: what q8_matmul_avx512.cpp needs from it.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>
