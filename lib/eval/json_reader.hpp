// A small JSON reader for Hugging Face config.json files: objects, arrays, strings, numbers, booleans,
// null. Malformed text throws std::invalid_argument with the byte offset.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvq::detail {

struct JsonValue {
    using Array = std::vector<JsonValue>;
    using Object = std::map<std::string, JsonValue, std::less<>>;
    std::variant<std::nullptr_t, bool, double, std::string, std::shared_ptr<Array>, std::shared_ptr<Object>> value;

    bool is_null() const { return std::holds_alternative<std::nullptr_t>(value); }
    const bool* as_bool() const { return std::get_if<bool>(&value); }
    const double* as_number() const { return std::get_if<double>(&value); }
    const std::string* as_string() const { return std::get_if<std::string>(&value); }
    const Array* as_array() const;
    const Object* as_object() const;
    // Member of an object, or nullptr (also when this is not an object).
    const JsonValue* find(std::string_view key) const;
};

JsonValue parse_json(std::string_view text);

}  // namespace kvq::detail
