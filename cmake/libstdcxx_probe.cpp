// Built with the chosen compiler and flags to see whether they link
// libstdc++ dynamically (cmake/shared_libstdcxx.cmake, tools/gpu_check.sh).
// std::ostringstream: the locale machinery a static copy duplicates, and a
// use of libstdc++ the linker cannot drop.
#include <sstream>

int main(int n, char**) {
  std::ostringstream s;
  s << n;
  return static_cast<int>(s.str().size()) - 1;
}
