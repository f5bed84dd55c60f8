#include "cmocka-compat.h"
#include "engine.h"
int
main(void)
{
  return 0;
}
