#include <string.h>

#include "bytes_codec.h"

static uint32_t load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

tsm_bytes_status tsm_bytes_index(const uint8_t *buf, size_t len, size_t count,
                                 size_t *starts, uint32_t *lengths,
                                 size_t *bad_index, size_t *remaining)
{
    size_t pos = 0;
    for (size_t i = 0; i < count; i++) {
        if (len - pos < 4) {
            *bad_index = i;
            *remaining = len - pos;
            return TSM_BYTES_SHORT_HEADER;
        }
        uint32_t n = load_le32(buf + pos);
        pos += 4;
        /* compare against what is left so the sum can never overflow */
        if ((size_t)n > len - pos) {
            *bad_index = i;
            *remaining = len - pos;
            return TSM_BYTES_OVERRUN;
        }
        if (starts) starts[i] = pos;
        if (lengths) lengths[i] = n;
        pos += n;
    }
    if (pos != len) {
        *bad_index = count;
        *remaining = len - pos;
        return TSM_BYTES_TRAILING;
    }
    return TSM_BYTES_OK;
}

tsm_bytes_status tsm_bytes_count(const uint8_t *buf, size_t len, size_t *count, size_t *remaining)
{
    size_t pos = 0, n_elements = 0;
    while (pos < len) {
        if (len - pos < 4) {
            *count = n_elements;
            *remaining = len - pos;
            return TSM_BYTES_SHORT_HEADER;
        }
        uint32_t n = load_le32(buf + pos);
        pos += 4;
        if ((size_t)n > len - pos) {
            *count = n_elements;
            *remaining = len - pos;
            return TSM_BYTES_OVERRUN;
        }
        pos += n;
        n_elements++;
    }
    *count = n_elements;
    *remaining = 0;
    return TSM_BYTES_OK;
}

size_t tsm_bytes_put(uint8_t *dst, const uint8_t *src, uint32_t n)
{
    dst[0] = (uint8_t)(n & 0xff);
    dst[1] = (uint8_t)((n >> 8) & 0xff);
    dst[2] = (uint8_t)((n >> 16) & 0xff);
    dst[3] = (uint8_t)((n >> 24) & 0xff);
    if (n) memcpy(dst + 4, src, n);
    return 4 + (size_t)n;
}
