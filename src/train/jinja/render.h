// The renderer: walks the parsed template over a context object and returns the text.
//
// Scopes follow Jinja2: the context's keys and the globals (range, namespace, dict,
// raise_exception, strftime_now) are visible everywhere; {% set %} at the top level or inside an
// {% if %} binds in the enclosing scope; every for-loop iteration and macro call has its own scope
// (a {% set %} there is gone after the iteration); a namespace() is shared by reference, so
// `{% set ns.x = ... %}` inside a loop is seen after it.
#pragma once

#include <ctime>
#include <string>
#include <vector>

#include "train/jinja/syntax.h"
#include "untied/core/json.h"

namespace untied::jinja {

// The text of `body` over `context` (a JSON object whose keys become variables). `now` is what
// strftime_now() formats, in local time. Throws TemplateError; `context` must outlive the call.
std::string render(const std::vector<Stmt>& body, const Json& context, std::time_t now);

}  // namespace untied::jinja
