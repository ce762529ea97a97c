// What cub leaves undefined, made recognizable: NaN for floating types, all ones for integers,
// all ones bytes for structs.
#pragma once
#include <string.h>

#include <limits>
#include <type_traits>

namespace quarry_emu {
template <typename T>
T poison() {
    if constexpr (std::is_floating_point_v<T>) {
        return std::numeric_limits<T>::quiet_NaN();
    } else {
        T t;
        memset(static_cast<void*>(&t), 0xff, sizeof(T));
        return t;
    }
}
}  // namespace quarry_emu
