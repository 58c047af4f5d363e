/* The rule tables: each pyggml/csrc/rules_<family>.c defines pg_rules_<family>[]; the
 * build lists them in rules_tables.h (CMakeLists.txt), and preconditions.c merges them. */
#pragma once
#include "preconditions.h"

#include "rules_tables.h"
