// Umbrella header for the nvio C++ API.
#pragma once

#include "nvio/checksum.hpp"
#include "nvio/config.hpp"
#include "nvio/errors.hpp"
#include "nvio/file.hpp"
#include "nvio/gpu.hpp"
#include "nvio/handle.hpp"
#include "nvio/interrupt.hpp"
#include "nvio/memory.hpp"
#include "nvio/options.hpp"
#include "nvio/pattern.hpp"
#include "nvio/safetensors.hpp"
#include "nvio/stripe.hpp"
#include "nvio/swapper.hpp"
#include "nvio/system.hpp"
#include "nvio/tune.hpp"
#include "nvio/warnings.hpp"
