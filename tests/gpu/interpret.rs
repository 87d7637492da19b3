//! Interpret mode against the GPU: every kernel of the GPU tests, at their
//! shapes and configs, launched on the GPU and then run by the interpreter
//! (`tilefuse::interpret`) on host copies of the same inputs at the same block
//! sizes; each output must agree within bf16 tolerance.
//!
//! Left out: the 4096×6656×16384 GEMM of the matmul and wgmma tests (446 G
//! multiply-adds, minutes on the CPU; the smaller shapes take the same code
//! paths of the interpreter). The Hopper configs that differ only in options
//! the interpreter has no use for (persistence, clusters, staging) run once.

use crate::common::examples::{cross_entropy, layer_norm, rms_norm, softmax};
use crate::common::interp::{out, scalars, tensors};
use crate::common::{gpu, host};
use std::collections::HashSet;
use tilefuse::interpret::{run, HostTensor, Scalar};
use tilefuse::prelude::*;
use tilefuse::{Device, Element, KernelDef};
use tilefuse_testkit::{poisoned, random_tensor, rel_error};

/// The interpreter's largest GEMM here, in multiply-adds.
const MAX_MACS: usize = 1 << 31;

fn copy<T: Element>(t: &Tensor<T>) -> HostTensor {
    HostTensor::from_f64(T::DTYPE, t.dims(), host(t)).unwrap()
}

/// A GPU launch, for the interpreter to redo: its kernel and config, host
/// copies of what it read, and what it wrote.
struct Launch<'a> {
    what: String,
    def: &'a KernelDef,
    cfg: Option<Config>,
    inputs: Vec<(&'static str, HostTensor)>,
    /// Each output's name, dtype and shape, and the GPU's values.
    outputs: Vec<(&'static str, HostTensor, Vec<f64>)>,
    scalars: Vec<(&'static str, Scalar)>,
}

impl Launch<'_> {
    fn output<T: Element>(mut self, name: &'static str, gpu: &Tensor<T>) -> Self {
        let poisoned =
            HostTensor::filled(T::DTYPE, gpu.dims(), f64::NAN).expect("a test-sized tensor");
        self.outputs.push((name, poisoned, host(gpu)));
        self
    }

    /// Runs the kernel in the interpreter and compares every output.
    fn redo(self, dev: &Device) {
        let ir = self.def.ir().unwrap().clone();
        let cfg = match self.cfg {
            Some(c) => c,
            None => self.def.config_on(dev).unwrap(),
        };
        let mut named = self.inputs;
        named.extend(self.outputs.iter().map(|(n, t, _)| (*n, t.clone())));
        let t = tensors(&ir, named);
        run(&ir, &cfg, &[], &t, &scalars(&ir, &self.scalars))
            .unwrap_or_else(|e| panic!("{} {cfg}: {e}", self.what));
        for (name, _, gpu) in &self.outputs {
            let cpu = out(&ir, &t, name);
            let err = rel_error(gpu, &cpu, |v| v, |v| v);
            eprintln!(
                "{} {cfg} `{name}`: GPU vs interpret rel err {err:.2e}",
                self.what
            );
            assert!(
                err <= 1e-2,
                "{} {cfg} `{name}`: GPU vs interpret rel err {err}",
                self.what
            );
        }
    }
}

fn launch<'a>(what: String, def: &'a KernelDef, cfg: &Option<Config>) -> Launch<'a> {
    Launch {
        what,
        def,
        cfg: cfg.clone(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        scalars: Vec::new(),
    }
}

fn on_gpu<R>(def: &KernelDef, cfg: &Option<Config>, f: impl FnOnce() -> R) -> R {
    match cfg {
        Some(c) => def.with_config(c.clone(), f),
        None => f(),
    }
}

fn mnk(m: usize, n: usize, k: usize) -> Vec<(&'static str, Scalar)> {
    vec![
        ("m", Scalar::Int(m as i64)),
        ("n", Scalar::Int(n as i64)),
        ("k", Scalar::Int(k as i64)),
    ]
}

/// The plain GEMM at the matmul tests' shapes and configs, and at the wgmma
/// tests' shapes with the Hopper configs' block sizes.
#[test]
fn interpret_mode_agrees_with_the_gpu_on_matmuls() {
    use crate::matmul::{mm_bf16, SHAPES};
    let Some(dev) = gpu() else { return };
    let mut cases: Vec<([usize; 3], Option<Config>)> = Vec::new();
    for shape in SHAPES {
        cases.extend(
            crate::matmul::configs(shape)
                .into_iter()
                .map(|c| (shape, c)),
        );
    }
    if dev.compute_capability().0 == 9 {
        let mut blocks = HashSet::new();
        let hopper: Vec<Config> = crate::common::wgmma_configs()
            .into_iter()
            .filter(|c| blocks.insert(c.block_sizes.clone()))
            .collect();
        for (m, n, k) in crate::wgmma::SHAPES {
            cases.extend(hopper.iter().map(|c| ([m, n, k], Some(c.clone()))));
        }
    }
    for ([m, n, k], cfg) in cases {
        if m * n * k > MAX_MACS {
            continue;
        }
        let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
        let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
        let c = poisoned::<bf16>([m, n]).unwrap();
        on_gpu(mm_bf16::kernel(), &cfg, || mm_bf16(&a, &b, &c)).unwrap();
        let mut l = launch(format!("matmul {m}x{n}x{k}"), mm_bf16::kernel(), &cfg);
        l.inputs = vec![("a", copy(&a)), ("b", copy(&b))];
        l.scalars = mnk(m, n, k);
        l.output("out", &c).redo(&dev);
    }
}

/// The fused epilogues (bias + gelu, scalar and residual and row bias, an f32
/// accumulator from a tensor, two outputs one transposed) at their tests' shapes.
#[test]
fn interpret_mode_agrees_with_the_gpu_on_epilogues() {
    use crate::epilogue::*;
    let Some(dev) = gpu() else { return };
    for [m, n, k] in SHAPES {
        let what = |name: &str| format!("{name} {m}x{n}x{k}");
        let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
        let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
        let (ha, hb) = (copy(&a), copy(&b));

        let bias = random_tensor::<bf16>([n], 1.0).unwrap();
        let o = poisoned::<bf16>([m, n]).unwrap();
        bias_gelu(&a, &b, &bias, &o).unwrap();
        let mut l = launch(what("bias_gelu"), bias_gelu::kernel(), &None);
        l.inputs = vec![("a", ha.clone()), ("b", hb.clone()), ("bias", copy(&bias))];
        l.scalars = mnk(m, n, k);
        l.output("out", &o).redo(&dev);

        let residual = random_tensor::<bf16>([m, n], 1.0).unwrap();
        let row_bias = random_tensor::<f32>([m], 1.0).unwrap();
        let o = poisoned::<bf16>([m, n]).unwrap();
        scaled_residual_relu(&a, &b, &residual, &row_bias, 0.75, &o).unwrap();
        let def = scaled_residual_relu::kernel();
        let mut l = launch(what("scaled_residual_relu"), def, &None);
        l.inputs = vec![
            ("a", ha.clone()),
            ("b", hb.clone()),
            ("residual", copy(&residual)),
            ("row_bias", copy(&row_bias)),
        ];
        l.scalars = mnk(m, n, k);
        l.scalars.push(("alpha", Scalar::Float(0.75)));
        l.output("out", &o).redo(&dev);

        let (a16, b16) = (
            random_tensor::<f16>([m, k], 1.0).unwrap(),
            random_tensor::<f16>([k, n], 1.0).unwrap(),
        );
        let c = random_tensor::<f32>([m, n], 1.0).unwrap();
        let o = poisoned::<f32>([m, n]).unwrap();
        accumulate_into(&a16, &b16, &c, &o).unwrap();
        let mut l = launch(what("accumulate_into"), accumulate_into::kernel(), &None);
        l.inputs = vec![("a", copy(&a16)), ("b", copy(&b16)), ("c", copy(&c))];
        l.scalars = mnk(m, n, k);
        l.output("out", &o).redo(&dev);

        let (o, ot) = (
            poisoned::<bf16>([m, n]).unwrap(),
            poisoned::<f16>([n, m]).unwrap(),
        );
        two_outputs(&a, &b, &o, &ot).unwrap();
        let mut l = launch(what("two_outputs"), two_outputs::kernel(), &None);
        l.inputs = vec![("a", ha), ("b", hb)];
        l.scalars = mnk(m, n, k);
        l.output("out", &o).output("out_t", &ot).redo(&dev);
    }
}

/// The elementwise kernels at their tests' shapes.
#[test]
fn interpret_mode_agrees_with_the_gpu_on_pointwise_kernels() {
    use crate::pointwise::*;
    let Some(dev) = gpu() else { return };
    let (m, n) = (1000, 777);
    let x = random_tensor::<f32>([m, n], 1.0).unwrap();
    let y = random_tensor::<f32>([m, n], 1.0).unwrap();
    let o = poisoned::<f32>([m, n]).unwrap();
    axpy_relu(&x, &y, 1.5, &o).unwrap();
    let mut l = launch(format!("axpy_relu {m}x{n}"), axpy_relu::kernel(), &None);
    l.inputs = vec![("x", copy(&x)), ("y", copy(&y))];
    l.scalars = mnk(m, n, 0);
    l.scalars.push(("alpha", Scalar::Float(1.5)));
    l.output("out", &o).redo(&dev);

    let len = 100_003;
    let x = random_tensor::<bf16>([len], 6.0).unwrap();
    let o = poisoned::<bf16>([len]).unwrap();
    sigmoid_1d(&x, &o).unwrap();
    let mut l = launch(format!("sigmoid_1d {len}"), sigmoid_1d::kernel(), &None);
    l.inputs = vec![("x", copy(&x))];
    l.scalars = mnk(0, len, 0);
    l.output("out", &o).redo(&dev);

    let (m, n) = (301, 1029);
    let x = random_tensor::<f16>([m, n], 1.0).unwrap();
    let bias = random_tensor::<f16>([n], 1.0).unwrap();
    let o = poisoned::<f32>([m, n]).unwrap();
    add_bias_rows(&x, &bias, &o).unwrap();
    let mut l = launch(
        format!("add_bias_rows {m}x{n}"),
        add_bias_rows::kernel(),
        &None,
    );
    l.inputs = vec![("x", copy(&x)), ("bias", copy(&bias))];
    l.scalars = mnk(m, n, 0);
    l.output("out", &o).redo(&dev);
}

/// The row kernels (softmax, RMSNorm, LayerNorm, cross-entropy) at the row
/// tests' shapes and configs.
#[test]
fn interpret_mode_agrees_with_the_gpu_on_row_kernels() {
    use crate::rows::{configs, SHAPES};
    let Some(dev) = gpu() else { return };
    for (m, n) in SHAPES {
        let named = |m: usize| {
            let mut s = mnk(m, n, 0);
            s.push(("n as f32", Scalar::Float(n as f32)));
            s.push(("eps", Scalar::Float(1e-5)));
            s
        };
        let x = random_tensor::<bf16>([m, n], 4.0).unwrap();
        let w = random_tensor::<bf16>([n], 1.0).unwrap();
        let bias = random_tensor::<bf16>([n], 1.0).unwrap();
        for cfg in configs() {
            let what = |name: &str| format!("{name} {m}x{n}");

            let o = poisoned::<bf16>([m, n]).unwrap();
            let def = softmax::softmax::kernel();
            on_gpu(def, &cfg, || softmax::softmax(&x, &o)).unwrap();
            let mut l = launch(what("softmax"), def, &cfg);
            l.inputs = vec![("x", copy(&x))];
            l.scalars = named(m);
            l.output("out", &o).redo(&dev);

            let o = poisoned::<bf16>([m, n]).unwrap();
            let def = rms_norm::rms_norm::kernel();
            on_gpu(def, &cfg, || rms_norm::rms_norm(&x, &w, &o, 1e-5)).unwrap();
            let mut l = launch(what("rms_norm"), def, &cfg);
            l.inputs = vec![("x", copy(&x)), ("weight", copy(&w))];
            l.scalars = named(m);
            l.output("out", &o).redo(&dev);

            let o = poisoned::<bf16>([m, n]).unwrap();
            let def = layer_norm::layer_norm::kernel();
            on_gpu(def, &cfg, || {
                layer_norm::layer_norm(&x, &w, &bias, &o, 1e-5)
            })
            .unwrap();
            let mut l = launch(what("layer_norm"), def, &cfg);
            l.inputs = vec![("x", copy(&x)), ("weight", copy(&w)), ("bias", copy(&bias))];
            l.scalars = named(m);
            l.output("out", &o).redo(&dev);

            // Cross-entropy walks the columns once: the config's first two blocks.
            let cfg2 = cfg
                .as_ref()
                .map(|c| Config::new(&c.block_sizes[..2]).num_warps(c.num_warps));
            let labels = cross_entropy::random_labels(m, n);
            let labels_d = Tensor::from_slice(&labels, [m]).unwrap();
            let loss = Tensor::full([m], f32::NAN).unwrap();
            let def = cross_entropy::cross_entropy::kernel();
            on_gpu(def, &cfg2, || {
                cross_entropy::cross_entropy(&x, &labels_d, &loss)
            })
            .unwrap();
            let mut l = launch(what("cross_entropy"), def, &cfg2);
            l.inputs = vec![("logits", copy(&x)), ("labels", copy(&labels_d))];
            l.scalars = named(m);
            l.output("loss", &loss).redo(&dev);
        }
    }
}

/// The GEMM that waits on per-chunk flags, with every flag already set, at the
/// wait test's shape and configs.
#[test]
fn interpret_mode_agrees_with_the_gpu_on_a_waiting_gemm() {
    use crate::wait::{gated_matmul, wait_configs};
    let Some(dev) = gpu() else { return };
    let (m, n, k, chunk) = (1024, 512, 256, 256);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let mut flags = Tensor::<u32>::flags(m / chunk).unwrap();
    flags.copy_from_slice(&vec![1u32; m / chunk]).unwrap();
    for cfg in wait_configs(&dev) {
        let cfg = Some(cfg);
        let o = poisoned::<bf16>([m, n]).unwrap();
        let def = gated_matmul::kernel();
        on_gpu(def, &cfg, || gated_matmul(&a, &b, &flags, chunk, &o)).unwrap();
        let mut l = launch(format!("gated_matmul {m}x{n}x{k}"), def, &cfg);
        l.inputs = vec![("a", copy(&a)), ("b", copy(&b)), ("progress", copy(&flags))];
        l.scalars = mnk(m, n, k);
        l.scalars
            .push(("rows_per_chunk", Scalar::Int(chunk as i64)));
        l.output("out", &o).redo(&dev);
    }
}
