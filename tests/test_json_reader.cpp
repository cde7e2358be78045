// The config.json reader: the JSON that configs contain, and clear errors for what is not JSON.
#include <doctest/doctest.h>

#include <stdexcept>

#include "eval/json_reader.hpp"

TEST_CASE("json reader: nested values, escapes and numbers") {
    const auto v = kvq::detail::parse_json(R"( {"a": [1, -2.5e3, true, null], "s": "q\"\\\/\n\u00e9\ud83d\ude00", "o": {"x": {}}} )");
    const auto* a = v.find("a")->as_array();
    REQUIRE(a);
    CHECK(*(*a)[0].as_number() == 1);
    CHECK(*(*a)[1].as_number() == -2500);
    CHECK(*(*a)[2].as_bool());
    CHECK((*a)[3].is_null());
    CHECK(*v.find("s")->as_string() == "q\"\\/\n\xc3\xa9\xf0\x9f\x98\x80");
    CHECK(v.find("o")->find("x")->as_object()->empty());
    CHECK(v.find("missing") == nullptr);
}

TEST_CASE("json reader: malformed text names the byte") {
    for (const char* bad : {"", "{", "{\"a\" 1}", "[1,]", "{\"a\": tru}", "\"unterminated", "{} x", "[01x]"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(kvq::detail::parse_json(bad), doctest::Contains("at byte"), std::invalid_argument);
    }
}
