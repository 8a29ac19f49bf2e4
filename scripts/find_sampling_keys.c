/* Search request seeds whose token-sampling Gumbel noise (DESIGN §5: murmur(seed, pos, 2^31 + v),
 * engine.sampling's SAMPLE_COLUMNS stream) hits an endpoint of the hash range at one position:
 *   mode 0: h = 0          at vocab id V_ID           (log u = -inf: g = -log(DBL_MAX) clamped)
 *   mode 1: h = 0xFFFFFFFF at any id in [0, VOCAB) except V_ID   (u = 1: g = -log(2^-32) clamped)
 * Keys: seed in [first, last), pos fixed. specs/generate/gumbel-endpoints.yaml uses the hits.
 * Build and run:  cc -O2 -o /tmp/find_sampling_keys scripts/find_sampling_keys.c
 *                 /tmp/find_sampling_keys MODE POS V_ID VOCAB FIRST LAST */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
static uint32_t mix(uint32_t h, uint32_t k) {
    k *= 0xcc9e2d51u; k = rotl(k, 15); k *= 0x1b873593u;
    h ^= k; h = rotl(h, 13); return h * 5 + 0xe6546b64u;
}
static uint32_t fmix(uint32_t h) {
    h ^= 16; h ^= h >> 16; h *= 0x85ebca6bu; h ^= h >> 13; h *= 0xc2b2ae35u; h ^= h >> 16;
    return h;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: MODE POS V_ID VOCAB FIRST LAST\n"); return 2; }
    int mode = atoi(argv[1]);
    uint32_t pos = (uint32_t)strtoul(argv[2], 0, 0), vid = (uint32_t)strtoul(argv[3], 0, 0);
    uint32_t vocab = (uint32_t)strtoul(argv[4], 0, 0);
    uint64_t first = strtoull(argv[5], 0, 0), last = strtoull(argv[6], 0, 0);
    const uint32_t base = 1u << 31;                       /* SAMPLE_COLUMNS */
    for (uint64_t s = first; s < last; s++) {
        uint32_t h0 = mix(mix(mix(0, (uint32_t)s), (uint32_t)(s >> 32)), pos);   /* shared by every column */
        if (mode == 0) {
            if (fmix(mix(h0, base + vid)) == 0) { printf("seed=%llu pos=%u id=%u hash=0\n", (unsigned long long)s, pos, vid); return 0; }
        } else {
            for (uint32_t v = 0; v < vocab; v++)
                if (v != vid && fmix(mix(h0, base + v)) == 0xFFFFFFFFu) {
                    printf("seed=%llu pos=%u id=%u hash=4294967295\n", (unsigned long long)s, pos, v); return 0;
                }
        }
    }
    printf("none in [%llu, %llu)\n", (unsigned long long)first, (unsigned long long)last);
    return 1;
}
