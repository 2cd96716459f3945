/* What a recorded block stands for (see estimate.h). */
#include "estimate.h"

#include "math_lite.h"
#include "state.h"

static double probability(uint64_t size) {
    return mt_one_minus_exp((double)(size ? size : 1) / (double)mt_state.sample_mean);
}

uint64_t mt_estimate_weight(uint64_t size) {
    if (!mt_state.sample_mean)
        return MT_WEIGHT_ONE;
    double p = probability(size);
    return p > 0 ? (uint64_t)((double)MT_WEIGHT_ONE / p + 0.5) : MT_WEIGHT_ONE;
}

uint64_t mt_estimate_bytes(uint64_t size) {
    if (!mt_state.sample_mean)
        return size;
    double p = probability(size);
    return p > 0 ? (uint64_t)((double)size / p + 0.5) : size;
}
