/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum the
 * manifest records per frame. SSE4.2 crc32 instruction when the CPU has
 * it, a slicing-by-8 table otherwise. Pure, thread-safe. */
#ifndef SPOT_CRC32C_H
#define SPOT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Continues a CRC over n more bytes: start with crc = 0, then feed the
 * result back in for the next piece. spot_crc32c(0, "123456789", 9) is
 * 0xE3069283. */
uint32_t spot_crc32c(uint32_t crc, const void *p, size_t n);

/* The table implementation, always (tests compare it with the above). */
uint32_t spot_crc32c_sw(uint32_t crc, const void *p, size_t n);

/* Whether spot_crc32c() uses the hardware instruction. */
int spot_crc32c_hw_available(void);

#endif
