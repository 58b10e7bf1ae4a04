/*
 * nn/loss.c — softmax cross-entropy (mean over the batch) and accuracy.
 */
#include <math.h>

#include "internal.h"

int nn_cross_entropy(const float *logits, const int *labels, size_t batch, size_t classes,
                     float *loss, float *dlogits)
{
    if (!logits || !labels || batch == 0 || classes == 0)
        return nn__fail("nn_cross_entropy: %s", !logits ? "logits is NULL"
                                                : !labels ? "labels is NULL"
                                                          : "batch and classes must be >= 1");
    for (size_t n = 0; n < batch; n++)
        if (labels[n] < 0 || (size_t)labels[n] >= classes)
            return nn__fail("nn_cross_entropy: label %d of sample %zu is not in [0, %zu)",
                            labels[n], n, classes);
    double total = 0.0;
    for (size_t n = 0; n < batch; n++) {
        const float *z = logits + n * classes;
        float mx = z[0];
        for (size_t j = 1; j < classes; j++)
            if (z[j] > mx) mx = z[j];
        double sum = 0.0;
        for (size_t j = 0; j < classes; j++) sum += exp((double)(z[j] - mx));
        double lse = log(sum) + (double)mx;
        total += lse - (double)z[labels[n]];
        if (dlogits) {
            /* (softmax - onehot) / batch; written after z is read (may alias) */
            float *d = dlogits + n * classes;
            for (size_t j = 0; j < classes; j++) {
                double sm = exp((double)z[j] - lse);
                d[j] = (float)((sm - (j == (size_t)labels[n] ? 1.0 : 0.0)) / (double)batch);
            }
        }
    }
    if (loss) *loss = (float)(total / (double)batch);
    return 0;
}

size_t nn_count_correct(const float *logits, const int *labels, size_t batch, size_t classes)
{
    if (!logits || !labels || classes == 0) return 0;
    size_t correct = 0;
    for (size_t n = 0; n < batch; n++) {
        const float *z = logits + n * classes;
        size_t best = 0;
        for (size_t j = 1; j < classes; j++)
            if (z[j] > z[best]) best = j;
        if ((int)best == labels[n]) correct++;
    }
    return correct;
}
