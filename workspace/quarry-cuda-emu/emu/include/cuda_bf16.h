// CUDA's header, on the CPU: see cuda_emu.h.
#pragma once
#include "cuda_emu.h"
