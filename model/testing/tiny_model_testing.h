// Tests' one way to get a tiny model: written to the test's temporary
// directory and opened. Test-only.
#ifndef PDSERVE_MODEL_TESTING_TINY_MODEL_TESTING_H_
#define PDSERVE_MODEL_TESTING_TINY_MODEL_TESTING_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "model/model.h"
#include "model/tiny_model.h"

namespace pdserve::model::testing {

// Writes the tiny model `options` describes to `file_name` in the test's
// temporary directory and opens it; adds a test failure and returns null
// when either fails.
std::unique_ptr<Model> OpenTinyModel(const TinyModelOptions& options,
                                     absl::string_view file_name);

}  // namespace pdserve::model::testing

#endif  // PDSERVE_MODEL_TESTING_TINY_MODEL_TESTING_H_
