/* Environment parsing: garbage falls back to defaults, ranges clamp. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "config.h"
#include "mtrace_api.h"

int main(void) {
    CHECK_EQ(mt_parse_depth(NULL), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth(""), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("abc"), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("-1"), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("12x"), MT_DEFAULT_DEPTH);
    CHECK_EQ(mt_parse_depth("0"), 1);
    CHECK_EQ(mt_parse_depth("16"), 16);
    CHECK_EQ(mt_parse_depth("100000"), MTRACE_MAX_DEPTH);
    CHECK_EQ(mt_parse_depth("99999999999999999999999"), MTRACE_MAX_DEPTH);

    CHECK_EQ(mt_parse_enabled(NULL), 1);
    CHECK_EQ(mt_parse_enabled("1"), 1);
    CHECK_EQ(mt_parse_enabled("0"), 0);
    CHECK_EQ(mt_parse_enabled("false"), 0);
    CHECK_EQ(mt_parse_enabled("garbage"), 1);

    int garbage;
    CHECK_EQ(mt_parse_sample_bytes(NULL, &garbage), 0);
    CHECK_EQ(garbage, 0);
    CHECK_EQ(mt_parse_sample_bytes("524288", &garbage), 524288);
    CHECK_EQ(garbage, 0);
    CHECK_EQ(mt_parse_sample_bytes("0", &garbage), 0);
    CHECK_EQ(garbage, 0);
    CHECK_EQ(mt_parse_sample_bytes("512k", &garbage), 0);
    CHECK_EQ(garbage, 1);
    CHECK_EQ(mt_parse_sample_bytes("-1", &garbage), 0);
    CHECK_EQ(garbage, 1);
    CHECK_EQ(mt_parse_sample_bytes("99999999999999999999999", &garbage), MT_MAX_SAMPLE_BYTES);
    CHECK_EQ(garbage, 0);
    CHECK_EQ(mt_parse_sample_bytes("1099511627776", &garbage), MT_MAX_SAMPLE_BYTES);
    CHECK_EQ(mt_parse_sample_bytes("1099511627777", &garbage), MT_MAX_SAMPLE_BYTES);
    CHECK_EQ(mt_parse_sample_bytes("1099511627775", &garbage), MT_MAX_SAMPLE_BYTES - 1);

    setenv("MTRACE_SAMPLE_BYTES", "1M", 1);
    setenv("MTRACE_DEPTH", "deep", 1);
    setenv("MTRACE_ENABLED", "maybe", 1);
    struct mt_config c;
    mt_config_load(&c);
    CHECK_EQ(c.sample_bytes, 0);
    CHECK_EQ(c.depth, MT_DEFAULT_DEPTH);
    CHECK_EQ(c.enabled, 1);
    CHECK_EQ(c.garbage, MT_GARBAGE_SAMPLE | MT_GARBAGE_DEPTH | MT_GARBAGE_ENABLED);
    setenv("MTRACE_SAMPLE_BYTES", "4096", 1);
    setenv("MTRACE_DEPTH", "12", 1);
    setenv("MTRACE_ENABLED", "off", 1);
    mt_config_load(&c);
    CHECK_EQ(c.sample_bytes, 4096);
    CHECK_EQ(c.depth, 12);
    CHECK_EQ(c.enabled, 0);
    CHECK_EQ(c.garbage, 0);

    CHECK(mt_program_listed("beam.smp", "beam.smp"));
    CHECK(!mt_program_listed("beam.smp", "beam"));
    CHECK(!mt_program_listed("beam.smp", "sh"));
    CHECK(mt_program_listed("sh, beam.smp", "beam.smp"));
    CHECK(mt_program_listed("*", "anything"));
    CHECK(mt_program_listed("a,*", "x"));
    CHECK(!mt_program_listed("", "x"));
    CHECK(!mt_program_listed(",,", "x"));
    return check_summary();
}
