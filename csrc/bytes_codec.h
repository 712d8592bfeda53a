/* BYTES tensor wire format: each element is a little-endian uint32 length followed
 * by that many bytes. These helpers index and write that format without the GIL. */
#ifndef TRITON_SHM_BYTES_CODEC_H
#define TRITON_SHM_BYTES_CODEC_H

#include <stddef.h>
#include <stdint.h>

/* Result of tsm_bytes_index. */
typedef enum {
    TSM_BYTES_OK = 0,
    TSM_BYTES_SHORT_HEADER = 1,   /* fewer than 4 bytes left for a length prefix */
    TSM_BYTES_OVERRUN = 2,        /* an element's length runs past the buffer */
    TSM_BYTES_TRAILING = 3        /* bytes left over after the last element */
} tsm_bytes_status;

/* Walks `count` elements of `buf`. When `starts`/`lengths` are not NULL they receive
 * each element's payload offset and length. On failure `*bad_index` is the element
 * that failed and `*remaining` the bytes left at that point. */
tsm_bytes_status tsm_bytes_index(const uint8_t *buf, size_t len, size_t count,
                                 size_t *starts, uint32_t *lengths,
                                 size_t *bad_index, size_t *remaining);

/* Counts the elements that fill `buf` exactly. On failure `*count` is the number of
 * whole elements before the one that failed and `*remaining` the bytes left there. */
tsm_bytes_status tsm_bytes_count(const uint8_t *buf, size_t len, size_t *count, size_t *remaining);

/* Writes one element (prefix + payload) at `dst`; returns bytes written. */
size_t tsm_bytes_put(uint8_t *dst, const uint8_t *src, uint32_t n);

#endif
