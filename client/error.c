/*
 * error.c: error codes and type names shared by liblarder, larderd and
 * larderctl, all generated from the X-macro lists in larder.h.
 */
#include "larder.h"

const char *larder_strerror(int err) {
  switch (err) {
    case 0: return "success";
#define LARDER_STRERROR_CASE_(name, code, msg) \
  case code: return msg;
      LARDER_ERRNO_MAP(LARDER_STRERROR_CASE_)
#undef LARDER_STRERROR_CASE_
    default: return "unknown error";
  }
}

const char *larder_err_name(int err) {
  switch (err) {
    case 0: return "OK";
#define LARDER_ERRNAME_CASE_(name, code, msg) \
  case code: return "LARDER_" #name;
      LARDER_ERRNO_MAP(LARDER_ERRNAME_CASE_)
#undef LARDER_ERRNAME_CASE_
    default: return "LARDER_EUNKNOWN";
  }
}

const char *larder_type_name(larder_type_t type) {
  static const char *const names[LARDER_TYPE_COUNT_] = {
      "null",       "bool",       "int8",   "int16",        "int32",        "int64",
      "uint8",      "uint16",     "uint32", "uint64",       "float16",      "float32",
      "float64",    "date32",     "time32", "time64",       "timestamp",    "decimal128",
      "decimal256", "binary",     "string", "large_binary", "large_string", "fixed_binary",
      "list",       "large_list", "struct", "map"};
  if ((unsigned)type < LARDER_TYPE_COUNT_) return names[type];
  return "?";
}
