// STREAM's triad, a = b + s·c, over f32 arrays of `n4` float4s: two arrays read and one written
// per element, as a kernel of kiln's own (the device copy is the driver's copy engine). A
// grid-stride loop of 16-byte loads and stores; built to PTX by build.rs with the `cuda` feature.
extern "C" __global__ void kiln_triad(float4 *a, const float4 *b, const float4 *c, float s, unsigned long long n4) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 x = b[i];
        float4 y = c[i];
        a[i] = make_float4(x.x + s * y.x, x.y + s * y.y, x.z + s * y.z, x.w + s * y.w);
    }
}
