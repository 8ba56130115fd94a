// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.30;

interface IEscrowWithdraw {
    function withdraw(address token) external;
}

/// @notice Test-only worker that refuses every ETH transfer, to prove a reverting payee
///         cannot block a release batch and cannot pull its deferred balance either.
contract RevertingReceiver {
    error NoEther();

    receive() external payable {
        revert NoEther();
    }

    function pull(address escrow) external {
        IEscrowWithdraw(escrow).withdraw(address(0));
    }
}
