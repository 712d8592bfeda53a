#include <string.h>

#include "assembler.h"

void tsm_gather(uint8_t *dst, const uint8_t *const *srcs, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (sizes[i]) memcpy(dst, srcs[i], sizes[i]);
        dst += sizes[i];
    }
}

void tsm_scatter(const uint8_t *src, uint8_t *const *dsts, const size_t *sizes, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (sizes[i]) memcpy(dsts[i], src, sizes[i]);
        src += sizes[i];
    }
}
