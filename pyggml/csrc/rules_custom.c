/* GGML_OP_CUSTOM: the nodes pyggml builds itself on ggml's custom-op mechanism (the
 * blocked attention backward, csrc/attn_node.c). Another custom node's callback is not
 * pyggml's to know: unchecked (proven in a guarded child before it runs). */
#include "preconditions.h"
#include "rules.h"

static int rule_custom(const struct ggml_tensor * t, pg_why * why) {
    if (pyggml_is_attn_bwd_node(t)) {
        return pyggml_attn_bwd_check(t, why);
    }
    return PYGGML_UNCHECKED;
}

const pg_named_rule pg_rules_custom[] = {
    {"CUSTOM", rule_custom},
    {NULL, NULL},
};
