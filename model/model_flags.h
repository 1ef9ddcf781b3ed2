// Which model a process serves, from its command line: --model and
// --served_model_name. Shared by the router (which reads the file for its
// tokenizer and chat template) and every worker (which runs it); they must
// agree on both, and nothing else of the workers' configuration belongs in
// the router, so these two flags live apart from the engine's.
#ifndef PDSERVE_MODEL_MODEL_FLAGS_H_
#define PDSERVE_MODEL_MODEL_FLAGS_H_

#include <string>

namespace pdserve::model {

// --model, or the default model's path (model/default_model.h).
std::string ModelPathFromFlags();

// The id clients use for the model (ModelInfo.id, the OpenAI "model"):
// --served_model_name, or the model file's name without ".gguf". The
// router and every worker of a cluster must agree on it.
std::string ServedModelName(const std::string& model_path);

}  // namespace pdserve::model

#endif  // PDSERVE_MODEL_MODEL_FLAGS_H_
