//! The shapes of the float ops' forwarding, one macro each: they expand to methods of
//! `FloatTensorOps` in `float.rs`, which runs them with the layout rules of `ops/mod.rs`.

macro_rules! unary_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
            unary(tensor, B::$name)
        })*
    };
}

macro_rules! scalar_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: Scalar) -> FloatTensor<Self> {
            unary(lhs, |t| B::$name(t, rhs))
        })*
    };
}

macro_rules! binary_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
            binary(stringify!($name), lhs, rhs, B::$name)
        })*
    };
}

macro_rules! compare_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>, out_dtype: BoolDType) -> BoolTensor<Self> {
            let l = full_inner(lhs, stringify!($name));
            let r = full_inner(rhs, stringify!($name));
            B::$name(l.get(), r.get(), out_dtype)
        })*
    };
}

macro_rules! compare_elem_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(lhs: FloatTensor<Self>, rhs: Scalar, out_dtype: BoolDType) -> BoolTensor<Self> {
            full_inner(lhs, stringify!($name)).consume(|l| B::$name(l, rhs, out_dtype))
        })*
    };
}

macro_rules! along_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
            along(tensor, dim, stringify!($name), |t| B::$name(t, dim))
        })*
    };
}

/// Reductions of the whole tensor by the inner op: a shard is gathered first.
macro_rules! whole_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>) -> FloatTensor<Self> {
            full_op(tensor, stringify!($name), B::$name)
        })*
    };
}

/// Reductions along one dimension by the inner op (see `reduce_dim_with`).
macro_rules! reduce_dim_ops {
    ($($name:ident),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>, dim: usize) -> FloatTensor<Self> {
            reduce_dim_with(tensor, dim, stringify!($name), |t| B::$name(t, dim))
        })*
    };
}

/// Ops whose result is a bool tensor (which has no layout): the operand is whole.
macro_rules! to_bool_ops {
    ($($name:ident($($arg:ident: $ty:ty),*)),* $(,)?) => {
        $(fn $name(tensor: FloatTensor<Self>, $($arg: $ty),*) -> BoolTensor<Self> {
            full_inner(tensor, stringify!($name)).consume(|t| B::$name(t, $($arg),*))
        })*
    };
}
