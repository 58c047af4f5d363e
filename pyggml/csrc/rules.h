/* The rule tables, one per file rules_<family>.c; preconditions.c merges them. */
#pragma once
#include "preconditions.h"

extern const pg_named_rule pg_rules_core[];        /* rules_core.c */

#define PG_RULE_TABLES pg_rules_core
