/* cmocka 1.1 API (Debian 12 ships 1.1.5); include this, not cmocka.h. */
#ifndef SPOT_CMOCKA_COMPAT_H
#define SPOT_CMOCKA_COMPAT_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#endif
