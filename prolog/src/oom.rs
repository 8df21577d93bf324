//! Recognising a GPU out-of-memory crash in a job's output.

/// Mentions of a CPU device or host memory: TensorFlow's OOM message names
/// the device, TensorFlow logs failed pinned host allocations with the
/// driver's OOM name, and host-memory exhaustion must not trigger a GPU
/// recovery.
const CPU_MARKERS: &[&str] = &["device:CPU", "/cpu:", "CPU:0", "DefaultCPUAllocator", "bytes on host"];

/// The last line of `text` that contains one of `patterns` and does not
/// name a CPU device; the last, because the crash comes at the end.
pub fn find_oom<'a>(text: &'a str, patterns: &[String]) -> Option<&'a str> {
    text.lines()
        .rev()
        .find(|line| {
            patterns.iter().any(|p| line.contains(p.as_str())) && !CPU_MARKERS.iter().any(|m| line.contains(m))
        })
        .map(str::trim)
}

/// The most an OOM message can say a run needed: 1 PiB in MiB, above any
/// GPU; placement clamps it further to the GPU's size.
pub const MAX_NEED_MIB: u64 = 1 << 30;

/// Memory the crashed run needed, from PyTorch's message: what it had
/// allocated plus what it tried to allocate, in MiB (for `looser` recovery).
/// `None` for what is no size ("inf", "NaN", negative); at most MAX_NEED_MIB.
pub fn needed_mib(line: &str) -> Option<u64> {
    fn size_before(line: &str, marker: &str) -> Option<f64> {
        let i = line.find(marker)?;
        let words: Vec<&str> = line[..i].split_whitespace().rev().take(2).collect();
        let (unit, num) = (words.first()?, words.get(1)?);
        let n: f64 = num.trim_start_matches('(').parse().ok()?;
        Some(match *unit {
            "GiB" => n * 1024.0,
            "MiB" => n,
            "KiB" => n / 1024.0,
            _ => return None,
        })
    }
    fn size_after(line: &str, marker: &str) -> Option<f64> {
        let rest = &line[line.find(marker)? + marker.len()..];
        let mut w = rest.split_whitespace();
        let n: f64 = w.next()?.parse().ok()?;
        Some(match w.next()?.trim_end_matches(['.', ',', ';', ')']) {
            "GiB" => n * 1024.0,
            "MiB" => n,
            "KiB" => n / 1024.0,
            _ => return None,
        })
    }
    let tried = size_after(line, "Tried to allocate ")?;
    let held = size_before(line, " is allocated by PyTorch")
        .or_else(|| size_before(line, " already allocated"))
        .unwrap_or(0.0);
    let need = tried + held;
    if !need.is_finite() || tried < 0.0 || held < 0.0 {
        return None;
    }
    Some((need.ceil() as u64).min(MAX_NEED_MIB))
}

#[cfg(test)]
mod tests {
    use super::*;
    use carma_config::Config;

    fn patterns() -> Vec<String> {
        Config::default().oom_patterns
    }

    #[test]
    fn real_world_gpu_oom_messages_match() {
        let cases = [
            // PyTorch 1.x
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.50 GiB already allocated; 5.44 MiB free; 14.62 GiB reserved in total by PyTorch)",
            // PyTorch 2.0-2.3
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 39.39 GiB total capacity; 36.10 GiB already allocated; 1.20 GiB free; 36.50 GiB reserved in total by PyTorch)",
            // PyTorch 2.4+
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39.39 GiB of which 1.20 GiB is free. Of the allocated memory 36.10 GiB is allocated by PyTorch, and 400.00 MiB is reserved by PyTorch but unallocated.",
            // TensorFlow 2
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[256,1024,14,14] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
            // JAX / XLA
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
            // NCCL
            "node01:1234:1300 [0] include/alloc.h:48 NCCL WARN Cuda failure 'out of memory'",
            // cuBLAS
            "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
            "cudaErrorMemoryAllocation: out of memory",
            // Verbatim from a real H100 (driver 580, docs/oom-messages.md):
            // PyTorch 2.11 starting on a GPU another process filled.
            "torch.AcceleratorError: CUDA error: out of memory",
            // PyTorch 1.x/2.0 print that line with no cudaErrorMemoryAllocation hint after it.
            "RuntimeError: CUDA error: out of memory",
            "RuntimeError: CUDA driver error: out of memory",
            // PyTorch 2.11 on H100, the allocator's message.
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 6.12 GiB. GPU 0 has a total capacity of 79.18 GiB of which 2.64 GiB is free. Including non-PyTorch memory, this process has 76.53 GiB memory in use. Of the allocated memory 73.21 GiB is allocated by PyTorch, and 2.71 GiB is reserved by PyTorch but unallocated.",
            // ROCm builds of PyTorch.
            "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 63.98 GiB of which 1.00 GiB is free.",
            // JAX 0.11 on H100: allocation, and start on a full GPU.
            "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 300.02GiB with allocator GPU_0_bfc on device 0.",
            "E0000 00:00:1700000000.000000    1234 pjrt_stream_executor_client.cc:3000] Failed to create stream executor for device CUDA:0: : CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Failed to allocate request for 1.20GiB (1288490188B) on device ordinal 0",
            // CuPy 14 on H100: memory pool, and the driver/runtime calls.
            "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 322,122,547,200 bytes (allocated so far: 0 bytes).",
            "cupy.cuda.memory.OutOfMemoryError: Out of memory allocating 512 bytes (allocated so far: 0 bytes).",
            "cupy_backends.cuda.api.driver.CUDADriverError: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorMemoryAllocation: out of memory",
            // TensorFlow 2 / Keras 3 (TF backend).
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error: OOM when allocating tensor with shape[64,512,28,28] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc",
            "2024-01-01 00:00:00.000000: E tensorflow/compiler/xla/stream_executor/cuda/cuda_driver.cc:1000] failed to allocate 1.20G (1288490188 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            // Numba.
            "numba.cuda.cudadrv.driver.CudaAPIError: [2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY",
            // NCCL: runtime check, driver check (newer NCCL prints the code).
            "gpu01:1234:1300 [0] NCCL INFO include/alloc.h:125 NCCL WARN Cuda failure 2 'out of memory'",
            // CUDA libraries.
            "RuntimeError: cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
            "RuntimeError: cusolver error: CUSOLVER_STATUS_ALLOC_FAILED, when calling `cusolverDnCreate(handle)`",
            "RuntimeError: CUDA error: CUSPARSE_STATUS_ALLOC_FAILED when calling `cusparseCreate(handle)`",
            "RuntimeError: cuFFT error: CUFFT_ALLOC_FAILED",
            // Hugging Face Accelerate's find_executable_batch_size / transformers' auto batch size.
            "RuntimeError: No executable batch size found, reached zero.",
        ];
        for c in cases {
            let text =
                format!("epoch 1 loss 0.5\nTraceback (most recent call last):\n  File \"train.py\", line 3\n{c}\n");
            assert_eq!(find_oom(&text, &patterns()), Some(c), "{c}");
        }
    }

    #[test]
    fn near_misses_do_not_match() {
        let cases = [
            "java.lang.OutOfMemoryError: Java heap space",
            "MemoryError",
            "slurmstepd: error: Detected 1 oom_kill event in StepId=12.batch. Some of the step tasks have been OOM Killed.",
            "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 3.00 GiB for an array with shape (20000, 20000)",
            "RuntimeError: [enforce fail at alloc_cpu.cpp:83] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 1234 bytes",
            "ResourceExhaustedError: OOM when allocating tensor with shape[100000,100000] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu",
            "W tensorflow/core/common_runtime/bfc_allocator.cc:290] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.0GiB with freed_by_count=0. The caller indicates that this is not a failure",
            "RuntimeError: CUDA error: device-side assert triggered",
            "Killed",
            // GPU errors that are not about memory.
            "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
            "torch.AcceleratorError: CUDA error: unspecified launch failure",
            "RuntimeError: CUDA driver error: unknown error",
            "gpu01:1234:1300 [0] NCCL WARN Cuda failure 1 'invalid argument'",
            "NCCL WARN Cuda failure 'unspecified launch failure'",
            "CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
            "jax.errors.JaxRuntimeError: INTERNAL: no supported devices found for platform CUDA",
            "RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle, opa, opb, m, n, k, &alpha, a, lda, b, ldb, &beta, c, ldc)`",
            // Host memory, named with the driver's OOM name (TensorFlow's pinned allocator).
            "E tensorflow/core/common_runtime/gpu/gpu_host_allocator.cc:40] failed to alloc 2147483648 bytes on host: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
            // Our own messages.
            "carma: this step was not started: job 5 step batch: no GPU fits",
        ];
        for c in cases {
            assert_eq!(find_oom(c, &patterns()), None, "{c}");
        }
    }

    #[test]
    fn needed_memory_from_pytorch_messages() {
        let v2 = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 39.39 GiB of which 1.20 GiB is free. Of the allocated memory 36.10 GiB is allocated by PyTorch, and 400.00 MiB is reserved by PyTorch but unallocated.";
        assert_eq!(needed_mib(v2), Some((2.0f64 * 1024.0 + 36.10 * 1024.0).ceil() as u64));
        let v1 = "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.50 GiB already allocated; 5.44 MiB free)";
        assert_eq!(needed_mib(v1), Some((20.0f64 + 14.5 * 1024.0).ceil() as u64));
        assert_eq!(needed_mib("RESOURCE_EXHAUSTED: Out of memory"), None);
    }

    #[test]
    fn absurd_sizes_in_a_message_are_no_need_or_clamped() {
        let msg = |tried: &str, held: &str| {
            format!(
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried} GiB. Of the allocated memory {held} GiB is allocated by PyTorch, and"
            )
        };
        for bad in ["inf", "NaN", "-inf", "-5"] {
            assert_eq!(needed_mib(&msg(bad, "1.00")), None, "{bad}");
            assert_eq!(needed_mib(&msg("1.00", bad)), None, "{bad}");
        }
        assert_eq!(needed_mib(&msg("1e30", "1.00")), Some(MAX_NEED_MIB));
        assert_eq!(needed_mib(&msg("2.00", "1.00")), Some(3072));
    }
}
