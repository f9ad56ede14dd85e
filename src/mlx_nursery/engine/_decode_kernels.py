"""The CUDA sources of the ragged decode attention (`_decode_attention.py`), for
`mx.fast.cuda_kernel`: MLX wraps each body in a kernel whose parameters are the inputs
(with `<name>_strides` and `<name>_shape` where the body reads them), the outputs, and the
template's constants (`REP` query heads a key-value head, head size `D`, `WARPS` a block,
`VLOAD` whether a lane reads a key's values in one load, output type `T`).

`PARTIAL` computes one slice of a row's keys for one key-value head and its `REP` query
heads, and writes the slice's unnormalized result with its maximum and sum; `COMBINE` folds
a row's slices; `WHOLE` is `PARTIAL` for a row taken in one slice, writing the result itself
(one launch a layer instead of two). The loop (`_BODY`): each warp takes tiles of 32 keys in
turn; a lane computes its key's scores for every head (the key read with 16-byte loads where
the layout allows, the scaled queries from shared memory), the warp updates its online
softmax once a tile (two reductions a head, not one a key), then each lane accumulates its
dimensions of the values over the tile's keys with the tile's weights from shared memory.
The block's warps are combined through shared memory at the end.
"""

HEADER = """
template <int N, typename T>
__device__ __forceinline__ void nursery_load_floats(const T* source, float* target) {
    // N elements (16 bytes) of T at `source` (16-byte aligned) as floats.
    const uint4 raw = *reinterpret_cast<const uint4*>(source);
    const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) {
        target[i] = static_cast<float>(values[i]);
    }
}

template <int N, typename T>
__device__ __forceinline__ void nursery_load_few(const T* source, float* target) {
    // N consecutive elements of T at `source` as floats: one load where they make 4, 8 or
    // 16 bytes (`source` aligned to that), else one load an element.
    constexpr int BYTES = N * sizeof(T);
    if constexpr (BYTES == 16) {
        const uint4 raw = *reinterpret_cast<const uint4*>(source);
        const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) target[i] = static_cast<float>(values[i]);
    } else if constexpr (BYTES == 8) {
        const uint2 raw = *reinterpret_cast<const uint2*>(source);
        const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) target[i] = static_cast<float>(values[i]);
    } else if constexpr (BYTES == 4) {
        const unsigned int raw = *reinterpret_cast<const unsigned int*>(source);
        const T* values = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int i = 0; i < N; ++i) target[i] = static_cast<float>(values[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) target[i] = static_cast<float>(source[i]);
    }
}
"""

_BODY = """
    // Flash decoding over one slice of one row's keys, for the query heads that share one
    // key-value head. Each warp takes tiles of 32 keys: a lane computes its key's scores
    // for every head (the key's row read with 16-byte loads, the queries from shared
    // memory), the warp updates its online softmax once a tile, then each lane accumulates
    // its dimensions of the values over the tile's keys.
    const float NEG_INF = __int_as_float(0xff800000);
    const int split = blockIdx.x;
    const int kv_head = blockIdx.y;
    const int row = blockIdx.z;
    const int splits = gridDim.x;
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    constexpr int E = D / 32;
    constexpr int VEC = 16 / sizeof(keys[0]);
    constexpr int LOOP = REP * D + WARPS * REP * 32;
    constexpr int FOLD = WARPS * REP * D;
    __shared__ float smem[LOOP > FOLD ? LOOP : FOLD];
    __shared__ float shared_m[WARPS][REP];
    __shared__ float shared_l[WARPS][REP];
    float* q_sh = smem;                   // [REP][D], scaled
    float* p_sh = smem + REP * D;         // [WARPS][REP][32]

    const int first = start[row];
    const int last = end[0];
    const int total = last > first ? last - first : 0;
    const int per_split = (total + splits - 1) / splits;
    const int lo = first + split * per_split;
    const int hi = min(last, lo + per_split);
    const float scale_value = scale[0];

    for (int i = threadIdx.x; i < REP * D; i += blockDim.x) {
        const int r = i / D;
        const int d = i % D;
        const int head = kv_head * REP + r;
        q_sh[i] = static_cast<float>(
            q[row * q_strides[0] + head * q_strides[1] + d * q_strides[3]]) * scale_value;
    }
    __syncthreads();

    float m[REP];
    float l[REP];
    float acc[REP][E];
#pragma unroll
    for (int r = 0; r < REP; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            acc[r][e] = 0.0f;
        }
    }

    const auto* k_base = keys + row * keys_strides[0] + kv_head * keys_strides[1];
    const auto* v_base = values + row * values_strides[0] + kv_head * values_strides[1];
    const long key_stride = keys_strides[2];
    const long value_stride = values_strides[2];
    const long value_dim_stride = values_strides[3];
    const bool vectors = keys_strides[3] == 1 && key_stride % VEC == 0
        && (reinterpret_cast<unsigned long long>(k_base) % 16) == 0;
    // With VLOAD, a lane accumulates E consecutive dimensions of the values (one load a
    // key), where the layout allows; else dimensions 32 apart (E loads a key).
    const bool by_lane = VLOAD && value_dim_stride == 1 && value_stride % E == 0
        && (reinterpret_cast<unsigned long long>(v_base) % (E * sizeof(values[0]))) == 0;
    float* p_warp = p_sh + warp * REP * 32;

    for (int tile = lo + warp * 32; tile < hi; tile += WARPS * 32) {
        const int key = tile + lane;
        const bool valid = key < hi;
        float s[REP];
#pragma unroll
        for (int r = 0; r < REP; ++r) {
            s[r] = 0.0f;
        }
        if (valid) {
            const auto* k_row = k_base + key * key_stride;
            if (vectors) {
#pragma unroll
                for (int d0 = 0; d0 < D; d0 += VEC) {
                    float kf[VEC];
                    nursery_load_floats<VEC>(k_row + d0, kf);
#pragma unroll
                    for (int j = 0; j < VEC; ++j) {
#pragma unroll
                        for (int r = 0; r < REP; ++r) {
                            s[r] += q_sh[r * D + d0 + j] * kf[j];
                        }
                    }
                }
            } else {
                for (int d = 0; d < D; ++d) {
                    const float kf = static_cast<float>(k_row[d * keys_strides[3]]);
#pragma unroll
                    for (int r = 0; r < REP; ++r) {
                        s[r] += q_sh[r * D + d] * kf;
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < REP; ++r) {
            float top = valid ? s[r] : NEG_INF;
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2) {
                top = fmaxf(top, __shfl_xor_sync(0xffffffff, top, offset));
            }
            const float m_new = fmaxf(m[r], top);  // finite: the tile's first key is valid
            const float correction = __expf(m[r] - m_new);
            const float p = valid ? __expf(s[r] - m_new) : 0.0f;
            float sum = p;
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2) {
                sum += __shfl_xor_sync(0xffffffff, sum, offset);
            }
            l[r] = l[r] * correction + sum;
            m[r] = m_new;
#pragma unroll
            for (int e = 0; e < E; ++e) {
                acc[r][e] *= correction;
            }
            p_warp[r * 32 + lane] = p;
        }
        __syncwarp();
        const int count = min(32, hi - tile);
        const auto* v_tile = v_base + tile * value_stride;
#pragma unroll 8
        for (int j = 0; j < count; ++j) {
            float vv[E];
            if (by_lane) {
                nursery_load_few<E>(v_tile + j * value_stride + lane * E, vv);
            } else {
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    const long at = j * value_stride + (e * 32 + lane) * value_dim_stride;
                    vv[e] = static_cast<float>(v_tile[at]);
                }
            }
#pragma unroll
            for (int r = 0; r < REP; ++r) {
                const float pj = p_warp[r * 32 + j];
#pragma unroll
                for (int e = 0; e < E; ++e) {
                    acc[r][e] += pj * vv[e];
                }
            }
        }
        __syncwarp();
    }

    __syncthreads();  // the loop's shared memory is reused for the warps' results
    float* shared_acc = smem;  // [WARPS][REP][D]
#pragma unroll
    for (int r = 0; r < REP; ++r) {
        if (lane == 0) {
            shared_m[warp][r] = m[r];
            shared_l[warp][r] = l[r];
        }
#pragma unroll
        for (int e = 0; e < E; ++e) {
            const int dim = by_lane ? lane * E + e : e * 32 + lane;
            shared_acc[(warp * REP + r) * D + dim] = acc[r][e];
        }
    }
    __syncthreads();

    // Every thread combines the warps for some (head, dimension) pairs of the block.
    for (int i = threadIdx.x; i < REP * D; i += blockDim.x) {
        const int r = i / D;
        const int d = i % D;
        float top = NEG_INF;
        for (int w = 0; w < WARPS; ++w) {
            top = fmaxf(top, shared_m[w][r]);
        }
        float sum = 0.0f;
        float value = 0.0f;
        if (top != NEG_INF) {
            for (int w = 0; w < WARPS; ++w) {
                const float weight = __expf(shared_m[w][r] - top);
                sum += shared_l[w][r] * weight;
                value += shared_acc[(w * REP + r) * D + d] * weight;
            }
        }
        const int head = kv_head * REP + r;
        WRITE
    }
"""

PARTIAL = _BODY.replace(
    "WRITE",
    """const long slot = ((long)row * (gridDim.y * REP) + head) * splits + split;
        partial_out[slot * D + d] = value;
        if (d == 0) {
            partial_max[slot] = top;
            partial_sum[slot] = sum;
        }""",
)

WHOLE = _BODY.replace(
    "WRITE",
    """out[((long)row * (gridDim.y * REP) + head) * D + d] =
            static_cast<T>(sum > 0.0f ? value / sum : 0.0f);""",
)
"""One slice a row (`splits` 1): the block writes the result, no combining kernel."""

COMBINE = """
    const float NEG_INF = __int_as_float(0xff800000);
    const int d = threadIdx.x;
    const int head = blockIdx.y;
    const int row = blockIdx.z;
    const int heads = gridDim.y;
    const int splits = partial_max_shape[2];
    const long base = ((long)row * heads + head) * splits;
    float top = NEG_INF;
    for (int s = 0; s < splits; ++s) {
        top = fmaxf(top, partial_max[base + s]);
    }
    float sum = 0.0f;
    float value = 0.0f;
    if (top != NEG_INF) {
        for (int s = 0; s < splits; ++s) {
            const float weight = __expf(partial_max[base + s] - top);
            sum += partial_sum[base + s] * weight;
            value += partial_out[(base + s) * D + d] * weight;
        }
    }
    out[((long)row * heads + head) * D + d] = static_cast<T>(sum > 0.0f ? value / sum : 0.0f);
"""
