//! The closed sets of states the store keeps: a run's status, a provisioning apply's and a step's.
//! Stored as their lower-case names; a name this build does not know is an error, never a guess.

/// Declares a string-valued enum: `as_str`, `FromStr`, `Display`, serde as the name, and sqlx
/// decoding from a TEXT column.
macro_rules! named_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<Self, UnknownName> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(UnknownName {
                        what: stringify!($name),
                        found: other.to_string(),
                        known: &[$($text),+],
                    }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        // Stored as text in either engine.
        impl<DB: sqlx::Database> sqlx::Type<DB> for $name
        where
            str: sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <str as sqlx::Type<DB>>::type_info()
            }

            fn compatible(ty: &DB::TypeInfo) -> bool {
                <str as sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for $name
        where
            &'r str: sqlx::Decode<'r, DB>,
        {
            fn decode(value: <DB as sqlx::Database>::ValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
                let text = <&str as sqlx::Decode<DB>>::decode(value)?;
                Ok(text.parse()?)
            }
        }
    };
}

/// A name that is not one of an enum's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {found:?} (known: {})", known.join(", "))]
pub struct UnknownName {
    pub what: &'static str,
    pub found: String,
    pub known: &'static [&'static str],
}

named_enum! {
    /// How a benchmark run ended.
    RunStatus {
        /// A result within the stability limit.
        Ok = "ok",
        /// A result whose coefficient of variation is above the limit: kept, marked.
        Unstable = "unstable",
        /// The benchmark's own check failed (training that did not learn): not a result.
        Failed = "failed",
        /// A figure broke its physical ceiling (the run's `status_reason` says which): never a result.
        Invalid = "invalid",
        /// Other processes or the hypervisor took more of the CPUs than allowed while it measured
        /// (`status_reason` gives the shares): kept and shown, never a result.
        Disturbed = "disturbed",
    }
}

impl RunStatus {
    /// Whether the run's figures are results that fleet comparisons may use.
    pub fn is_result(self) -> bool {
        matches!(self, RunStatus::Ok | RunStatus::Unstable)
    }
}

named_enum! {
    /// Where a provisioning apply stands.
    ApplyStatus {
        /// Started and not finished: in progress, or its kiln died (then `--resume` continues it).
        Running = "running",
        Succeeded = "succeeded",
        Failed = "failed",
        /// Stopped by SIGINT/SIGTERM between steps.
        Interrupted = "interrupted",
    }
}

named_enum! {
    /// Where one journaled provisioning step stands.
    StepStatus {
        /// Written before the step runs; left so when kiln dies during it.
        Started = "started",
        Succeeded = "succeeded",
        Failed = "failed",
        /// A step a dead kiln left started, found by `--resume`.
        Interrupted = "interrupted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for s in RunStatus::ALL {
            assert_eq!(s.as_str().parse::<RunStatus>(), Ok(*s));
            assert_eq!(serde_json::to_string(s).unwrap(), format!("\"{s}\""));
        }
        for s in ApplyStatus::ALL {
            assert_eq!(s.as_str().parse::<ApplyStatus>(), Ok(*s));
        }
        for s in StepStatus::ALL {
            assert_eq!(s.as_str().parse::<StepStatus>(), Ok(*s));
        }
        let err = "OK".parse::<RunStatus>().unwrap_err();
        assert_eq!(err.to_string(), "unknown RunStatus \"OK\" (known: ok, unstable, failed, invalid, disturbed)");
        assert!(serde_json::from_str::<RunStatus>("\"done\"").is_err());
        assert!(RunStatus::Unstable.is_result() && !RunStatus::Failed.is_result() && !RunStatus::Invalid.is_result());
        assert!(!RunStatus::Disturbed.is_result());
    }
}
