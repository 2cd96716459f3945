/* What a recorded block stands for (see estimate.h). */
#include "estimate.h"

#include "math_lite.h"
#include "state.h"

struct mt_estimate mt_estimate_of(uint64_t size) {
    uint64_t mean = mt_state.sample_mean;
    if (!mean)
        return (struct mt_estimate){MT_WEIGHT_ONE, size};
    double p = mt_one_minus_exp((double)(size ? size : 1) / (double)mean);
    if (!(p > 0))
        return (struct mt_estimate){MT_WEIGHT_ONE, size};
    return (struct mt_estimate){(uint64_t)((double)MT_WEIGHT_ONE / p + 0.5),
                                (uint64_t)((double)size / p + 0.5)};
}
