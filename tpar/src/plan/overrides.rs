//! `TPAR_*` settings in NCCL's manner: parsing, validation against the fabric.
//!
//! Owns: every variable's grammar and its error message. Must never: be silently ignored —
//! [`Overrides::validate`] refuses at init what the plan would have to ignore.

pub use super::floors::MAX_KERNEL_BLOCKS;
use super::feasibility::{check, natural_transport, transport_usable, Fabric};
use crate::error::{Error, Result};
use crate::kinds::{Algorithm, Backend, Transport};
use crate::topology::Topology;
use crate::units::parse_bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;


/// `TPAR_*` settings, NCCL style. The default is "no override".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// `TPAR_ALGO`: force an algorithm (`auto` or unset: none).
    pub algorithm: Option<Algorithm>,
    /// `TPAR_TRANSPORT`: force a transport.
    pub transport: Option<Transport>,
    /// `TPAR_MAX_BYTES`: above this size, NCCL (accepts 42K, 1M, 1G).
    pub max_bytes: Option<u64>,
    /// `TPAR_DISABLE`: always NCCL.
    pub disable: bool,
    /// `TPAR_DEBUG=INFO` (or `TRACE`): log each plan decision once with its reason.
    #[serde(skip)]
    pub debug: bool,
    /// `TPAR_PROFILE`: path of a tuned profile. The path is not part of the plan digest; the
    /// profile's contents are.
    #[serde(skip)]
    pub profile: Option<PathBuf>,
    /// `TPAR_BLOCKS`: thread blocks per call of tpar's kernels (1..=[`MAX_KERNEL_BLOCKS`]),
    /// instead of the size-based default. For measuring; NCCL calls are not affected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// `TPAR_CHECK_CALLS=0`: tpar's kernels stop comparing every call's count, dtype and
    /// algorithm across ranks (the check costs a few tenths of a microsecond per call; a
    /// rank calling something else then produces a wrong sum instead of an error). Part of
    /// the plan digest: ranks must agree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_calls: Option<bool>,
    /// `TPAR_HOST_PROTOCOL`: how the push kernels synchronise over the host transport
    /// (`flags` or `sentinel`; `auto` or unset: by world size, [`HostProtocol::auto`]). Part
    /// of the plan digest: ranks must agree (the two protocols cannot meet in one workspace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_protocol: Option<HostProtocol>,
}

/// The push kernels' protocol over the host transport (docs/cuda.md, "Protocols").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HostProtocol {
    /// Data polled for a sentinel-free value; the reader clears its inbox one call behind.
    Sentinel,
    /// Data, then one release flag per (block, source) carrying the call's generation;
    /// nothing cleared.
    Flags,
}

impl HostProtocol {
    /// The protocol for `world` ranks when none is forced: flags from
    /// [`HostProtocol::FLAGS_MIN_WORLD`] ranks. They drop the clears (half the PCIe write
    /// traffic) and write one-shot's input once, into the writer's own host area, instead of
    /// once per peer, but add a round trip per stage (flag, then data). On one H200 (emulated
    /// ranks, 122 x 42 KiB, one-shot push, the plan's pick over host; sentinel vs flags):
    /// 2 ranks 7.37 vs 8.27 us, 3 ranks 15.65 vs 13.16, 4 ranks 23.3 vs 19.3, 8 ranks 93.8
    /// vs 60.9 (bench/results/h200-1gpu-hostpipe.md; two-shot: h200-1gpu-hostproto.md).
    pub fn auto(world: usize) -> HostProtocol {
        if world >= Self::FLAGS_MIN_WORLD {
            HostProtocol::Flags
        } else {
            HostProtocol::Sentinel
        }
    }
    /// Smallest world that uses flags by default.
    pub const FLAGS_MIN_WORLD: usize = 3;

    /// Parses `TPAR_HOST_PROTOCOL`'s value: `auto` is `None`.
    pub fn parse(raw: &str) -> Result<Option<HostProtocol>> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "flags" => Ok(Some(HostProtocol::Flags)),
            "sentinel" => Ok(Some(HostProtocol::Sentinel)),
            _ => Err(config("TPAR_HOST_PROTOCOL", raw, "expected auto, flags or sentinel")),
        }
    }
}


/// The variables [`Overrides`] reads.
pub const OVERRIDE_VARS: [&str; 9] = ["TPAR_ALGO", "TPAR_TRANSPORT", "TPAR_MAX_BYTES", "TPAR_DISABLE", "TPAR_DEBUG", "TPAR_PROFILE", "TPAR_BLOCKS", "TPAR_CHECK_CALLS", "TPAR_HOST_PROTOCOL"];

fn config(var: &'static str, value: &str, reason: impl fmt::Display) -> Error {
    Error::Config { var, value: value.to_string(), reason: reason.to_string() }
}

impl Overrides {
    /// Reads the `TPAR_*` variables of this process.
    /// A value that is not UTF-8 is a `Config` error (`std::env::vars` would panic on it).
    pub fn from_env() -> Result<Overrides> {
        let mut pairs = Vec::new();
        for var in OVERRIDE_VARS {
            if let Some(v) = std::env::var_os(var) {
                let v = v.into_string().map_err(|raw| config(var, &raw.to_string_lossy(), "not valid UTF-8"))?;
                pairs.push((var, v));
            }
        }
        Overrides::from_pairs(pairs)
    }

    /// Parses (name, value) pairs; other names are ignored, empty values mean unset.
    pub fn from_pairs<I, K, V>(pairs: I) -> Result<Overrides>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut o = Overrides::default();
        for (k, v) in pairs {
            let (k, raw) = (k.as_ref(), v.as_ref());
            let v = raw.trim();
            if v.is_empty() {
                continue;
            }
            match k {
                "TPAR_ALGO" => {
                    o.algorithm = if v.eq_ignore_ascii_case("auto") {
                        None
                    } else {
                        Some(v.parse::<Algorithm>().map_err(|e| config("TPAR_ALGO", raw, e))?)
                    }
                }
                "TPAR_TRANSPORT" => {
                    o.transport = if v.eq_ignore_ascii_case("auto") {
                        None
                    } else {
                        Some(v.parse::<Transport>().map_err(|e| config("TPAR_TRANSPORT", raw, e))?)
                    }
                }
                "TPAR_MAX_BYTES" => o.max_bytes = Some(parse_bytes(v).map_err(|e| config("TPAR_MAX_BYTES", raw, e))?),
                "TPAR_DISABLE" => o.disable = parse_bool(v).ok_or_else(|| config("TPAR_DISABLE", raw, "expected 1/0, true/false, yes/no or on/off"))?,
                "TPAR_DEBUG" => {
                    o.debug = match v.to_ascii_uppercase().as_str() {
                        "INFO" | "TRACE" => true,
                        "NONE" | "OFF" | "VERSION" | "WARN" => false,
                        _ => return Err(config("TPAR_DEBUG", raw, "expected NONE, VERSION, WARN, INFO or TRACE")),
                    }
                }
                "TPAR_PROFILE" => o.profile = Some(PathBuf::from(v)),
                "TPAR_CHECK_CALLS" => {
                    o.check_calls = Some(parse_bool(v).ok_or_else(|| config("TPAR_CHECK_CALLS", raw, "expected 1/0, true/false, yes/no or on/off"))?)
                }
                "TPAR_HOST_PROTOCOL" => o.host_protocol = HostProtocol::parse(raw)?,
                "TPAR_BLOCKS" => {
                    o.blocks = if v.eq_ignore_ascii_case("auto") {
                        None
                    } else {
                        match v.parse::<u32>() {
                            Ok(b) if (1..=MAX_KERNEL_BLOCKS).contains(&b) => Some(b),
                            _ => return Err(config("TPAR_BLOCKS", raw, format!("expected auto or 1..={MAX_KERNEL_BLOCKS}"))),
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(o)
    }

    /// Refuses overrides that cannot run correctly on this fabric, naming the variable and
    /// why. Call at init: [`plan`] itself ignores such overrides (it must return something),
    /// but a forced setting that is silently ignored would be a lie.
    pub fn validate(&self, topology: &Topology, world: usize, backend: Backend) -> Result<()> {
        let world = world.max(1);
        let fabric = Fabric::of(topology, world, backend);
        match backend {
            Backend::Cpu => {
                if self.disable {
                    return Err(unsupported("TPAR_DISABLE=1", "the CPU backend has no NCCL to fall back to"));
                }
                if let Some(m) = self.max_bytes {
                    return Err(unsupported(&format!("TPAR_MAX_BYTES={m}"), "the CPU backend has no NCCL to send larger messages to"));
                }
            }
            Backend::Cuda => {}
        }
        if self.disable && self.algorithm.is_some_and(|a| a != Algorithm::Nccl) {
            return Err(unsupported("TPAR_DISABLE=1 with TPAR_ALGO", "TPAR_DISABLE forces NCCL; unset one of them"));
        }
        if let Some(t) = self.transport {
            transport_usable(t, &fabric).map_err(|why| unsupported(&format!("TPAR_TRANSPORT={t}"), &why))?;
        }
        if let Some(a) = self.algorithm {
            let t = self.transport.unwrap_or_else(|| natural_transport(a, &fabric));
            check(a, t, &fabric).map_err(|why| unsupported(&format!("TPAR_ALGO={a} over {t}"), &why))?;
        }
        Ok(())
    }
}

fn unsupported(what: &str, why: &str) -> Error {
    Error::Unsupported { what: what.to_string(), reason: why.to_string() }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}



#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_protocol_parses_and_is_in_the_digest_only_when_set() {
        assert_eq!(HostProtocol::parse("flags").unwrap(), Some(HostProtocol::Flags));
        assert_eq!(HostProtocol::parse(" Sentinel ").unwrap(), Some(HostProtocol::Sentinel));
        assert_eq!(HostProtocol::parse("auto").unwrap(), None);
        assert!(HostProtocol::parse("lamport").is_err());
        let o = Overrides::from_pairs([("TPAR_HOST_PROTOCOL", "flags")]).unwrap();
        assert_eq!(o.host_protocol, Some(HostProtocol::Flags));
        assert!(Overrides::from_pairs([("TPAR_HOST_PROTOCOL", "x")]).is_err());
        // Serialised (the plan digest) only when set, so existing digests are unchanged.
        let unset = serde_json::to_string(&Overrides::default()).unwrap();
        assert!(!unset.contains("host_protocol"), "{unset}");
        assert!(serde_json::to_string(&o).unwrap().contains("\"host_protocol\":\"flags\""));
        assert_eq!(HostProtocol::auto(2), HostProtocol::Sentinel);
        assert_eq!(HostProtocol::auto(3), HostProtocol::Flags);
        assert_eq!(HostProtocol::auto(4), HostProtocol::Flags);
        assert_eq!(HostProtocol::auto(8), HostProtocol::Flags);
    }
}
