//! [`listed_enum!`]: a fieldless enum with explicit discriminants, declared once, with its `ALL` list (and,
//! when each variant names itself, its `name()`), so that the variant list is written in one place.

/// Declares a `#[repr]` enum whose variants carry explicit values, plus `pub const ALL: [Self; N]` (every
/// variant, in declaration order). With `Variant = value => "name"`, also `pub const fn name(self)`.
#[macro_export]
macro_rules! listed_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr => $label:literal ),+ $(,)?
        }
    ) => {
        $crate::listed_enum! {
            $(#[$meta])*
            $vis enum $name { $( $(#[$vmeta])* $variant = $value ),+ }
        }

        impl $name {
            /// The name listed beside the variant.
            pub const fn name(self) -> &'static str {
                match self {
                    $( $name::$variant => $label, )+
                }
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $value:expr ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $value, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$( stringify!($variant) ),+].len()] = [$( $name::$variant ),+];
        }
    };
}
