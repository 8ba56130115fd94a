// js-ipfs 0.66 expects Promise.withResolvers, which Node 20 lacks; loaded with NODE_OPTIONS=--require.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve;
    let reject;
    const promise = new Promise((res, rej) => {
      resolve = res;
      reject = rej;
    });
    return { promise, resolve, reject };
  };
}
